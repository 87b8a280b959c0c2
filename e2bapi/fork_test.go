package e2bapi

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

// TestFork: one keepRunning Checkpoint, count restores of it, each a new
// sandbox id with the source's token and metadata; the source runs on.
func TestFork(t *testing.T) {
	f := newFixture(t)
	src := f.createSandbox("key-a", `{"metadata":{"m":"1"},"timeout":60}`)
	var res []forkResult
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/fork", `{"count":2,"timeout":120}`, &res); code != http.StatusCreated || len(res) != 2 {
		t.Fatalf("fork: %d %+v", code, res)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps, client.InNamespace("team-a")); err != nil || len(cps.Items) != 1 {
		t.Fatalf("Checkpoints after fork: %v %d, want one", err, len(cps.Items))
	}
	cp := cps.Items[0]
	if *cp.Spec.KeepRunning != true || cp.Labels[LabelSnapshot] != src.SandboxID {
		t.Errorf("fork's Checkpoint %+v", cp.ObjectMeta)
	}
	seen := map[string]bool{src.SandboxID: true}
	for i, r := range res {
		if r.Sandbox == nil || r.Error != nil || seen[r.Sandbox.SandboxID] || r.Sandbox.EnvdAccessToken == nil || *r.Sandbox.EnvdAccessToken != *src.EnvdAccessToken {
			t.Fatalf("fork %d: %+v %+v", i, r.Sandbox, r.Error)
		}
		seen[r.Sandbox.SandboxID] = true
		p := f.pod("team-a", podName(r.Sandbox.SandboxID, 0))
		if p.Annotations[controller.AnnotationRestoreCheckpoint] != cp.Name || p.Status.Phase != corev1.PodRunning {
			t.Errorf("fork %d pod: %v %s", i, p.Annotations, p.Status.Phase)
		}
		var d listedBody
		if f.do("key-a", "GET", "/sandboxes/"+r.Sandbox.SandboxID, "", &d); d.Metadata["m"] != "1" || d.EndAt != "2026-12-05T12:02:00Z" {
			t.Errorf("fork %d info: %+v", i, d)
		}
	}
	var d listedBody
	if f.do("key-a", "GET", "/sandboxes/"+src.SandboxID, "", &d); d.State != "running" || d.EndAt != "2026-12-05T12:01:00Z" {
		t.Errorf("source after fork: %+v", d)
	}

	// The SDK's default count is the server's: one.
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`, &res); code != http.StatusCreated || len(res) != 1 || res[0].Sandbox == nil {
		t.Errorf("fork without count: %d %+v", code, res)
	}
	var e apiError
	for _, body := range []string{`{"count":0}`, fmt.Sprintf(`{"count":%d}`, maxForks+1), `{"timeout":-1}`} {
		if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/fork", body, &e); code != http.StatusBadRequest || e.Code != 400 {
			t.Errorf("fork %s: %d %+v", body, code, e)
		}
	}
	if code := f.do("key-b", "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`, &e); code != http.StatusNotFound {
		t.Errorf("fork with another namespace's key: %d", code)
	}
}

// TestForkFailure: a fork whose envd refuses /init is an entry with an
// error, not a failed call, and leaves no pod or Secret of its own.
func TestForkFailure(t *testing.T) {
	f := newFixture(t)
	src := f.create("key-a", `{}`)
	f.initCode.Store(http.StatusUnauthorized)
	var res []forkResult
	if code := f.do("key-a", "POST", "/sandboxes/"+src+"/fork", `{"count":1}`, &res); code != http.StatusCreated || len(res) != 1 ||
		res[0].Sandbox != nil || res[0].Error == nil || res[0].Error.Code != http.StatusBadGateway {
		t.Fatalf("fork: %d %+v", code, res)
	}
	var pods corev1.PodList
	if err := f.cl.List(context.Background(), &pods, client.InNamespace("team-a")); err != nil || len(pods.Items) != 1 {
		t.Errorf("pods after a failed fork: %v %d, want the source's only", err, len(pods.Items))
	}
	var secs corev1.SecretList
	if err := f.cl.List(context.Background(), &secs, client.HasLabels{LabelSandbox}); err != nil || len(secs.Items) != 1 {
		t.Errorf("sandbox token Secrets after a failed fork: %v %d, want the source's only", err, len(secs.Items))
	}
}

// TestMetrics: totals from the pod's limits, usage from the kubelet's
// stats summary of that pod; a paused sandbox has no sample.
func TestMetrics(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	p := f.pod("team-a", podName(id, 0))
	p.Spec.NodeName = "node-1"
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("512Mi"),
	}
	if err := f.cl.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	var asked string
	f.srv.NodeStats = func(_ context.Context, node string) ([]byte, error) {
		asked = node
		return []byte(fmt.Sprintf(`{"pods":[
			{"podRef":{"name":"other","namespace":"team-a"},"cpu":{"usageNanoCores":9}},
			{"podRef":{"name":%q,"namespace":"team-a"},"cpu":{"usageNanoCores":500000000},
			 "memory":{"workingSetBytes":1000,"usageBytes":1500,"rssBytes":800},
			 "ephemeral-storage":{"usedBytes":4096,"capacityBytes":1048576}}]}`, p.Name)), nil
	}
	var ms []metricBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id+"/metrics?start=1&end=2", "", &ms); code != 200 || len(ms) != 1 {
		t.Fatalf("metrics: %d %+v", code, ms)
	}
	want := metricBody{Timestamp: "2026-12-05T12:00:00Z", TimestampUnix: f.now.Unix(), CPUCount: 2, CPUUsedPct: 25,
		MemUsed: 1000, MemTotal: 512 << 20, MemCache: 700, DiskUsed: 4096, DiskTotal: 1048576}
	if ms[0] != want || asked != "node-1" {
		t.Errorf("metrics %+v from node %q, want %+v", ms[0], asked, want)
	}

	f.srv.NodeStats = func(context.Context, string) ([]byte, error) { return nil, fmt.Errorf("no proxy") }
	if code := f.do("key-a", "GET", "/sandboxes/"+id+"/metrics", "", &ms); code != 200 || len(ms) != 1 || ms[0].MemUsed != 0 || ms[0].MemTotal != 512<<20 {
		t.Errorf("metrics without stats: %d %+v, want totals and zero usage", code, ms)
	}
	var e apiError
	if code := f.do("key-a", "GET", "/sandboxes/"+id+"/metrics?start=yesterday", "", &e); code != http.StatusBadRequest {
		t.Errorf("metrics with a bad start: %d", code)
	}
	if code := f.do("key-b", "GET", "/sandboxes/"+id+"/metrics", "", &e); code != http.StatusNotFound {
		t.Errorf("metrics with another namespace's key: %d", code)
	}
	f.controllerPauses("team-a", p.Name)
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := f.do("key-a", "GET", "/sandboxes/"+id+"/metrics", "", &ms); code != 200 || len(ms) != 0 {
		t.Errorf("metrics of a paused sandbox: %d %+v", code, ms)
	}
}

// TestForkPaused: a paused sandbox forks from its pause Checkpoint, with
// no new Checkpoint, and stays paused.
func TestForkPaused(t *testing.T) {
	f := newFixture(t)
	src := f.createSandbox("key-a", `{}`)
	f.controllerPauses("team-a", podName(src.SandboxID, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	var res []forkResult
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`, &res); code != http.StatusCreated || len(res) != 1 || res[0].Sandbox == nil ||
		*res[0].Sandbox.EnvdAccessToken != *src.EnvdAccessToken {
		t.Fatalf("fork of a paused sandbox: %d %+v", code, res)
	}
	if p := f.pod("team-a", podName(res[0].Sandbox.SandboxID, 0)); p.Annotations[controller.AnnotationRestoreCheckpoint] != podName(src.SandboxID, 0) {
		t.Errorf("fork pod %v", p.Annotations)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps, client.InNamespace("team-a")); err != nil || len(cps.Items) != 1 {
		t.Errorf("Checkpoints: %v %d, want the pause only", err, len(cps.Items))
	}
	var d listedBody
	if f.do("key-a", "GET", "/sandboxes/"+src.SandboxID, "", &d); d.State != "paused" {
		t.Errorf("source after fork: %+v", d)
	}
}
