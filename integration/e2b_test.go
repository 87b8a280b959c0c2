//go:build integration

package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestE2BControlPlane drives the controller's E2B API with the official SDK
// (npm e2b, harness.E2BSDKVersion) on the test cluster: create (its envd
// given the token by /init), getInfo, list by state and metadata,
// setTimeout, createSnapshot (the sandbox running on), listSnapshots, create
// from the snapshot (a new sandbox id, the source's RAM), deleteSnapshot,
// fork (two restores of one keepRunning Checkpoint), getMetrics, pause (the
// pod gone, the Checkpoint Succeeded), connect (a new pod restoring it under
// the same sandbox id, its RAM carried over), kill, the refusals (unknown
// id, bad key, another namespace's key, unsupported fields, template
// builds, volumes, oversized requests), and a timeout with onTimeout
// 'pause'. Node runs in the cluster's network namespace, where the
// controller's pod address is reachable.
//
// It needs envd in the guest (agent/envd): create waits for /init.
func TestE2BControlPlane(t *testing.T) {
	sdk := harness.E2BSDK(t)
	k := harness.StartK8s(t)
	k.StartController(t, harness.ControllerArgs("--e2b-templates=base="+harness.Image))
	const keyA, keyB = "e2b-key-team-default", "e2b-key-team-other"
	apiKey(t, k, "team-default", "default", keyA)
	apiKey(t, k, "team-other", "other", keyB)
	ip := strings.TrimSpace(k.MustKubectl("-n", harness.ControllerNamespace, "get", "pods",
		"-l", "app.kubernetes.io/name=cryo-controller", "-o", "jsonpath={.items[0].status.podIP}"))
	if ip == "" {
		t.Fatal("the controller's pod has no address")
	}
	script, err := filepath.Abs(filepath.Join("testdata", "e2b_control_plane.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	token := ""
	run := func(step string, args ...string) map[string]any {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "nsenter", append([]string{"--net=" + k.NetNS, "node", script, step}, args...)...)
		cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+ip+":3000", "E2B_API_KEY="+keyA,
			"OTHER_KEY="+keyB, "RUN=it", "E2B_SDK_DIR="+sdk, "TOKEN="+token)
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("SDK step %s: %v\n%s%s", step, err, out, stderr)
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("SDK step %s printed %q: %v", step, out, err)
		}
		return res
	}

	created := run("create")
	id, _ := created["id"].(string)
	token, _ = created["token"].(string)
	if id == "" {
		t.Fatalf("create printed %v", created)
	}
	pod0, pod1 := "e2b-"+id+"-0", "e2b-"+id+"-1"
	t.Cleanup(func() { k.Kubectl("delete", "pod,checkpoint,secret", "-l", "cryo.dev/e2b-sandbox="+id, "--wait=false") })
	t.Cleanup(func() { k.Kubectl("delete", "checkpoint,secret", "-l", "cryo.dev/e2b-snapshot="+id, "--wait=false") })
	k.WaitReady(pod0, time.Now(), 3*time.Minute)
	if rc := k.MustKubectl("get", "pod", pod0, "-o", "jsonpath={.spec.runtimeClassName} {.metadata.labels.cryo\\.dev/e2b-sandbox} {.metadata.labels.cryo\\.dev/runtime-class}"); rc != "cryo "+id+" cryo" {
		t.Fatalf("sandbox pod: runtime class and labels %q, want cryo %s cryo", rc, id)
	}
	if tok := k.MustKubectl("get", "secret", "e2b-"+id, "-o", "jsonpath={.data.envdAccessToken}"); tok == "" {
		t.Errorf("no envd token Secret e2b-%s", id)
	}
	if env := k.Exec(pod0, "sandbox", "sh", "-c", "echo $GREETING"); strings.TrimSpace(env) != "hi" {
		t.Errorf("envVars: GREETING=%q in the sandbox", env)
	}
	// RAM state the resumed pod must carry: a tmpfs file and a process.
	secret := strings.TrimSpace(k.Exec(pod0, "sandbox", "sh", "-c",
		"head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /dev/shm/secret; cat /dev/shm/secret"))
	run("running", id)

	// A snapshot, and a sandbox from it with the source's RAM.
	snap := run("snapshot", id)
	snapID, _ := snap["snapshotId"].(string)
	copyID, _ := snap["copyId"].(string)
	t.Cleanup(func() { k.Kubectl("delete", "pod,secret", "-l", "cryo.dev/e2b-sandbox="+copyID, "--wait=false") })
	if got := k.MustKubectl("get", "checkpoint", snapID, "-o", "jsonpath={.status.phase} {.spec.keepRunning} {.metadata.labels.cryo\\.dev/e2b-snapshot}"); got != "Succeeded true "+id {
		t.Errorf("snapshot Checkpoint %s: phase, keepRunning, label %q", snapID, got)
	}
	restored(t, k, copyID, snapID, secret)
	run("dropsnapshot", snapID, copyID)

	// Two forks, each with the source's RAM.
	forked := run("fork", id)
	forks, _ := forked["ids"].([]any)
	if len(forks) != 2 {
		t.Fatalf("fork printed %v", forked)
	}
	for _, f := range forks {
		fid := f.(string)
		t.Cleanup(func() { k.Kubectl("delete", "pod,secret", "-l", "cryo.dev/e2b-sandbox="+fid, "--wait=false") })
		from := k.MustKubectl("get", "pod", "e2b-"+fid+"-0", "-o", "jsonpath={.metadata.annotations.cryo\\.dev/restore-checkpoint}")
		restored(t, k, fid, from, secret)
		run("kill", fid)
	}
	run("metrics", id)

	run("pause", id)
	if out, _, err := k.Kubectl("get", "pod", pod0, "-o", "name"); err == nil {
		t.Errorf("pod %s still there after pause: %s", pod0, out)
	}
	if ph := k.MustKubectl("get", "checkpoint", pod0, "-o", "jsonpath={.status.phase} {.spec.keepRunning}"); ph != "Succeeded false" {
		t.Errorf("Checkpoint %s after pause: phase and keepRunning %q, want Succeeded false", pod0, ph)
	}

	run("connect", id)
	k.WaitReady(pod1, time.Now(), 3*time.Minute)
	if got := k.MustKubectl("get", "pod", pod1, "-o", "jsonpath={.metadata.labels.cryo\\.dev/e2b-sandbox} {.metadata.annotations.cryo\\.dev/restore-checkpoint}"); got != id+" "+pod0 {
		t.Errorf("resumed pod: sandbox label and restore-checkpoint %q, want %s %s", got, id, pod0)
	}
	if got := strings.TrimSpace(k.Exec(pod1, "sandbox", "cat", "/dev/shm/secret")); got != secret {
		t.Errorf("the resumed sandbox's /dev/shm/secret is %q, want %q (RAM lost)", got, secret)
	}

	run("refusals", id)
	run("kill", id)
	if !harness.WaitFor(time.Minute, func() bool {
		out, _, err := k.Kubectl("get", "pod,checkpoint", "-l", "cryo.dev/e2b-sandbox="+id, "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	}) {
		out, _, _ := k.Kubectl("get", "pod,checkpoint", "-l", "cryo.dev/e2b-sandbox="+id)
		t.Errorf("after kill the sandbox still has:\n%s", out)
	}

	auto := run("autopause")
	autoID, _ := auto["id"].(string)
	t.Cleanup(func() { k.Kubectl("delete", "pod,checkpoint", "-l", "cryo.dev/e2b-sandbox="+autoID, "--wait=false") })
}

// restored checks that sandbox id's first pod restores Checkpoint from
// and holds the source's RAM file.
func restored(t *testing.T, k *harness.K8s, id, from, secret string) {
	t.Helper()
	pod := "e2b-" + id + "-0"
	k.WaitReady(pod, time.Now(), 3*time.Minute)
	if got := k.MustKubectl("get", "pod", pod, "-o", "jsonpath={.metadata.annotations.cryo\\.dev/restore-checkpoint}"); got != from || from == "" {
		t.Errorf("pod %s restores %q, want %q", pod, got, from)
	}
	if got := strings.TrimSpace(k.Exec(pod, "sandbox", "cat", "/dev/shm/secret")); got != secret {
		t.Errorf("pod %s: /dev/shm/secret is %q, want the source's %q", pod, got, secret)
	}
}

// apiKey creates an E2B API key Secret bound to namespace ns.
func apiKey(t testing.TB, k *harness.K8s, name, ns, key string) {
	t.Helper()
	k.MustKubectl("-n", harness.ControllerNamespace, "create", "secret", "generic", name, "--from-literal=apiKey="+key)
	k.MustKubectl("-n", harness.ControllerNamespace, "label", "secret", name, "cryo.dev/e2b-api-key=")
	k.MustKubectl("-n", harness.ControllerNamespace, "annotate", "secret", name, "cryo.dev/e2b-namespace="+ns)
}
