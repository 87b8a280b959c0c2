package e2bapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

// pauseResume pauses sandbox id's pod of generation gen through the API
// and resumes it with connect: its pod of generation gen+1 runs.
func (f *fixture) pauseResume(id string, gen int) {
	f.t.Helper()
	f.controllerPauses("team-a", podName(id, gen))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		f.t.Fatalf("pause of %s: %d", podName(id, gen), code)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":60}`, nil); code != http.StatusCreated {
		f.t.Fatalf("connect of %s: %d", id, code)
	}
}

// deletePod is kubectl delete pod, an eviction or a node drain: pod
// team-a/name goes, and no API call knows.
func (f *fixture) deletePod(name string) {
	f.t.Helper()
	if err := f.cl.Delete(context.Background(), f.pod("team-a", name)); err != nil {
		f.t.Fatal(err)
	}
}

// TestResumedPodDeleted: a sandbox whose resumed pod is deleted outside
// a pause (kubectl delete pod, an eviction, a drain) is gone, as one
// whose VM died: its pause Checkpoint is the state before the resume,
// which its owner went past. 404 for every call but kill, not listed,
// "not found" at the gateway (which starts no pod, autoResume or not),
// kept until the end time its resume gave it, then removed by the reaper
// as a kill removes it; a kill removes it sooner.
func TestResumedPodDeleted(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()
	id := f.create("key-a", `{"templateID":"base","timeout":60,"autoPause":true,"autoResume":{"enabled":true}}`)
	f.pauseResume(id, 0)
	cp := f.checkpoint("team-a", podName(id, 0))
	if cp.Annotations[annResumedAs] != podName(id, 1) || cp.Annotations[annResumedEndAt] != f.pod("team-a", podName(id, 1)).Annotations[annEndAt] {
		t.Errorf("the resumed Checkpoint's annotations %v: want it marked resumed as %s until its end", cp.Annotations, podName(id, 1))
	}
	if p := f.pod("team-a", podName(id, 1)); p.Annotations[annResumedAs] != "" || p.Annotations[annResumedEndAt] != "" {
		t.Errorf("the resumed pod carries the Checkpoint's marks: %v", p.Annotations)
	}
	f.deletePod(podName(id, 1))
	f.gone(id)

	// The reaper leaves it until the end time its resume gave it.
	r := &Reaper{Server: f.srv, Cache: f.cl}
	f.now = f.now.Add(30 * time.Second)
	r.Reap(ctx)
	f.checkpoint("team-a", podName(id, 0))
	f.now = f.now.Add(time.Minute)
	r.Reap(ctx)
	f.removed(id)

	killed := f.create("key-a", `{"templateID":"base","timeout":3600}`)
	f.pauseResume(killed, 0)
	f.deletePod(podName(killed, 1))
	if code := f.do("key-a", "DELETE", "/sandboxes/"+killed, "", nil); code != http.StatusNoContent {
		t.Errorf("kill of a sandbox whose resumed pod was deleted: %d, want 204", code)
	}
	f.removed(killed)
}

// TestResumedAgain: the resumed pod's own pause and the next resume work
// as the first did, the marks are never copied onward, and the rule holds
// at any generation: the pod of the second resume deleted, the sandbox is
// gone, not back at its second pause.
func TestResumedAgain(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base","timeout":60,"metadata":{"turn":"1"}}`)
	f.pauseResume(id, 0)
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "running" {
		t.Fatalf("after the first resume: %d %+v", code, d)
	}
	f.pauseResume(id, 1)
	p := f.pod("team-a", podName(id, 2))
	if p.Annotations[controller.AnnotationRestoreCheckpoint] != podName(id, 1) || p.Annotations[annResumedAs] != "" {
		t.Errorf("second resumed pod's annotations %v", p.Annotations)
	}
	if cp := f.checkpoint("team-a", podName(id, 1)); cp.Annotations[annResumedAs] != podName(id, 2) {
		t.Errorf("second pause Checkpoint's annotations %v: want it marked resumed as %s", cp.Annotations, podName(id, 2))
	}
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "running" || d.Metadata["turn"] != "1" {
		t.Errorf("after the second resume: %d %+v", code, d)
	}
	f.deletePod(podName(id, 2))
	f.gone(id)
}

// TestResumeCreateFails: a resume whose pod is not created leaves the
// sandbox paused, unmarked, and resumable.
func TestResumeCreateFails(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{"templateID":"base"}`)
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	f.srv.Client = refusingClient{f.cl}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, nil); code != http.StatusInternalServerError {
		t.Errorf("connect whose pod is refused: %d, want 500", code)
	}
	f.srv.Client = f.cl
	if cp := f.checkpoint("team-a", podName(id, 0)); cp.Annotations[annResumedAs] != "" {
		t.Errorf("a resume that made no pod marked its Checkpoint: %v", cp.Annotations)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "paused" {
		t.Errorf("after a resume that made no pod: %d %+v, want paused", code, d)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, nil); code != http.StatusCreated {
		t.Errorf("connect after: %d", code)
	}
}

// refusingClient refuses every pod create, as an admission webhook or a
// quota may.
type refusingClient struct{ client.Client }

func (c refusingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*corev1.Pod); ok {
		return errors.New("admission webhook refused the pod")
	}
	return c.Client.Create(ctx, obj, opts...)
}

// laggingPods lists pods as the API server did a moment before pod name
// was created: a list of pods, then of Checkpoints, that a resume fell
// between.
type laggingPods struct {
	client.Client
	name string
}

func (c laggingPods) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	dropPods(list, func(p *corev1.Pod) bool { return p.Name == c.name })
	return nil
}

// TestResumedRace: lists that show a resume's mark but not its pod (the
// API server's pods-then-Checkpoints lists with the resume between them,
// or a cache whose pod informer trails its Checkpoint informer) do not
// make the sandbox gone: one read of the pod finds it running, for
// getInfo, connect, the list, the gateway and the reaper. A cache that
// trails a pause of the resumed pod (the pod gone, its Checkpoint not yet
// seen) does not either: the gateway's autoResume resumes the newest
// state.
func TestResumedRace(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()
	id := f.create("key-a", `{"templateID":"base","timeout":60,"autoResume":{"enabled":true}}`)
	f.pauseResume(id, 0)
	resumed := podName(id, 1)

	// The API server's lists, a resume between them.
	f.srv.Client = laggingPods{f.cl, resumed}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "running" {
		t.Errorf("getInfo with the resumed pod missed by the pod list: %d %+v, want running", code, d)
	}
	var sb sandboxBody
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, &sb); code != http.StatusOK || sb.SandboxID != id {
		t.Errorf("connect with the resumed pod missed by the pod list: %d %+v, want 200 (running)", code, sb)
	}

	// A cache that shows the mark and not the pod.
	f.srv.Client = f.cl
	lag := laggingPods{f.cl, resumed}
	f.srv.Cache = lag
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != 200 || len(list) != 1 || list[0].SandboxID != id || list[0].State != "running" {
		t.Errorf("list from a cache without the resumed pod: %d %+v, want it running", code, list)
	}
	f.srv.Cache = nil
	f.gw.Cache = lag
	f.cc.reads.Store(0)
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("gateway request with a cache without the resumed pod: %d %q", code, body)
	}
	if n := f.cc.reads.Load(); n != 1 {
		t.Errorf("it read the API server %d times, want 1 (the pod)", n)
	}
	if n := f.cc.pods.Load(); n != 0 {
		t.Errorf("the gateway created %d pods for a sandbox that runs", n)
	}
	f.now = f.now.Add(2 * time.Minute) // past the resume's end time
	(&Reaper{Server: f.srv, Cache: lag}).Reap(ctx)
	if p := f.pod("team-a", resumed); p.DeletionTimestamp != nil {
		t.Errorf("the reaper removed a sandbox whose resumed pod runs")
	}
	f.checkpoint("team-a", podName(id, 0))

	// A cache from before the resumed pod's pause, without that pod.
	stale := staleCache(t, f.fixture)
	if err := stale.(client.Client).Delete(ctx, f.pod("team-a", resumed)); err != nil {
		t.Fatal(err)
	}
	f.controllerPauses("team-a", resumed)
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause of the resumed pod: %d", code)
	}
	// It catches up once the gateway has resumed the sandbox.
	f.gw.Cache = catchingUp{stale, f.cl, func() bool { return f.cc.pods.Load() > 0 }}
	f.runningOnceCreated("team-a", podName(id, 2))
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("gateway request with a cache behind a pause: %d %q, want it resumed", code, body)
	}
	if p := f.pod("team-a", podName(id, 2)); p.Annotations[controller.AnnotationRestoreCheckpoint] != resumed {
		t.Errorf("autoResume restored %q, want the newest pause %s", p.Annotations[controller.AnnotationRestoreCheckpoint], resumed)
	}
	if n := f.cc.pods.Load(); n != 1 {
		t.Errorf("the gateway created %d pods, want 1", n)
	}
}

// catchingUp reads stale until caught() is true, then cur: a cache whose
// informers have seen nothing for a while.
type catchingUp struct {
	stale, cur client.Reader
	caught     func() bool
}

func (c catchingUp) reader() client.Reader {
	if c.caught() {
		return c.cur
	}
	return c.stale
}

func (c catchingUp) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.reader().Get(ctx, key, obj, opts...)
}

func (c catchingUp) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.reader().List(ctx, list, opts...)
}

// TestFailedPauseThenPodDeleted: a sandbox whose newest pause failed
// where the API did not see it (it stopped while waiting, so the failed
// Checkpoint stays) and whose pod was then deleted outside the API is
// gone, as one gone with its resumed pod: not back at its older pause.
// The reaper removes its objects at the end its pod had, not before.
func TestFailedPauseThenPodDeleted(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()
	id := f.create("key-a", `{"templateID":"base","timeout":60}`)
	f.pauseResume(id, 0)
	p := f.pod("team-a", podName(id, 1))
	ann := map[string]string{}
	for k, v := range p.Annotations {
		if strings.HasPrefix(k, e2bAnnotationPrefix) {
			ann[k] = v
		}
	}
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: p.Name, Labels: map[string]string{LabelSandbox: id}, Annotations: ann},
		Spec:       cryov1.CheckpointSpec{PodName: p.Name, KeepRunning: ptr(false)},
	}
	if err := f.cl.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	cp.Status.Phase = cryov1.PhaseFailed
	if err := f.cl.Update(ctx, cp); err != nil {
		t.Fatal(err)
	}
	f.deletePod(p.Name)
	f.gone(id)

	r := &Reaper{Server: f.srv, Cache: f.cl}
	f.now = f.now.Add(30 * time.Second)
	r.Reap(ctx)
	f.checkpoint("team-a", p.Name)
	f.now = f.now.Add(time.Minute)
	r.Reap(ctx)
	f.removed(id)
}
