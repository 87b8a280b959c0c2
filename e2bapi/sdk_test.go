package e2bapi

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// sdkDir is the official SDK that make deps installs for the
// integration tests (integration/harness.E2BSDKVersion).
const sdkDir = "/var/cache/cryo/tools/e2b-sdk@2.51.0"

// TestSDK runs the integration test's SDK steps (node and the official
// SDK, integration/testdata/e2b_control_plane.mjs) against the API over
// the fake cluster and envd of the other tests: every path, body, status
// and error shape as the SDK reads them, in seconds and without QEMU.
// TestE2BControlPlane runs the same steps on a real cluster.
func TestSDK(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("no node on PATH")
	}
	if _, err := os.Stat(sdkDir + "/node_modules/e2b"); err != nil {
		t.Skipf("no E2B SDK (make deps installs it): %v", err)
	}
	f := newFixture(t)
	f.srv.Now = time.Now
	// The Checkpoint controller's keepRunning false: Succeeded, pod gone.
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	defer func() { cancel(); <-stopped }()
	go func() {
		defer close(stopped)
		for ctx.Err() == nil {
			var cps cryov1.CheckpointList
			if f.cl.List(ctx, &cps) == nil {
				for i := range cps.Items {
					c := &cps.Items[i]
					if c.Status.Phase == "" && c.Spec.KeepRunning != nil && !*c.Spec.KeepRunning {
						c.Status.Phase = cryov1.PhaseSucceeded
						if f.cl.Update(ctx, c) == nil {
							var p corev1.Pod
							if f.cl.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Spec.PodName}, &p) == nil {
								_ = f.cl.Delete(ctx, &p)
							}
						}
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	token := ""
	run := func(step string, args ...string) map[string]any {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "node", append([]string{"../integration/testdata/e2b_control_plane.mjs", step}, args...)...)
		cmd.Env = append(os.Environ(), "E2B_API_URL="+f.url, "E2B_API_KEY=key-a", "OTHER_KEY=key-b", "RUN=it",
			"E2B_SDK_DIR="+sdkDir, "TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", step, err, out)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%s: %s", step, out)
		}
		return m
	}
	c := run("create")
	id := c["id"].(string)
	token = c["token"].(string)
	run("running", id)
	s := run("snapshot", id)
	run("dropsnapshot", s["snapshotId"].(string), s["copyId"].(string))
	fk := run("fork", id)
	for _, x := range fk["ids"].([]any) {
		run("kill", x.(string))
	}
	run("metrics", id)
	run("pause", id)
	run("connect", id)
	run("refusals", id)
	run("kill", id)
}
