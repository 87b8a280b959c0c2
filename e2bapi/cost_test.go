package e2bapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

// labelledCache plays the controller's cache, which holds only the pods
// labelled controller.LabelRuntimeClass.
type labelledCache struct{ client.Reader }

func (c labelledCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if p, ok := obj.(*corev1.Pod); ok && p.Labels[controller.LabelRuntimeClass] == "" {
		return apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
	}
	return nil
}

func (c labelledCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Reader.List(ctx, list, opts...); err != nil {
		return err
	}
	dropPods(list, func(p *corev1.Pod) bool { return p.Labels[controller.LabelRuntimeClass] == "" })
	return nil
}

// dropPods removes from list, when it is a pod list, the pods drop says
// a test's reader does not show.
func dropPods(list client.ObjectList, drop func(*corev1.Pod) bool) {
	if pl, ok := list.(*corev1.PodList); ok {
		pl.Items = slices.DeleteFunc(pl.Items, func(p corev1.Pod) bool { return drop(&p) })
	}
}

// TestGatewayCost: what a gateway request costs the API server (the
// Server's client, counted; the cache's reads are not): nothing for ids
// that name no sandbox, however many; one read by name for a sandbox the
// cache shows paused, which also finds the resumed pod of a sandbox that
// the cache does not hold, and serves it.
func TestGatewayCost(t *testing.T) {
	f := newGatewayFixture(t)
	f.gw.Cache = labelledCache{f.cl}
	f.cc.reads.Store(0)
	for i := range 50 {
		id := fmt.Sprintf("madeup%d", i)
		code, _, body := f.send(id, "GET", "/health", "", nil)
		f.refusal(code, body, 502, id, "The sandbox was not found")
	}
	if n := f.cc.reads.Load(); n != 0 {
		t.Errorf("50 requests for unknown ids read the API server %d times, want 0", n)
	}

	id := f.create("key-a", `{"templateID":"base"}`)
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	f.cc.reads.Store(0)
	for range 5 {
		code, _, body := f.send(id, "GET", "/health", "", nil)
		f.refusal(code, body, 502, id, "paused")
	}
	if n := f.cc.reads.Load(); n != 5 {
		t.Errorf("5 requests for a paused sandbox read the API server %d times, want 5", n)
	}

	// Resumed by Sandbox.connect, and its owner removed the label that
	// puts its pod in the cache: the cache shows it paused still.
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, nil); code != http.StatusCreated {
		t.Fatalf("connect: %d", code)
	}
	p := f.pod("team-a", podName(id, 1))
	delete(p.Labels, controller.LabelRuntimeClass)
	if err := f.cl.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.cc.reads.Store(0)
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("request to the resumed sandbox the cache does not hold: %d %q", code, body)
	}
	if n := f.cc.reads.Load(); n != 1 {
		t.Errorf("it read the API server %d times, want 1", n)
	}
	if n := f.cc.pods.Load(); n != 0 {
		t.Errorf("the gateway created %d pods for a sandbox that runs", n)
	}
}

// TestReaperCost: a tick reads the cache only, whatever it holds (a
// sandbox with time left, an expired one whose pause is under way, an
// ended one before its timeout); a sandbox whose end has passed in the
// cache is read from the API server before anything is done to it, so
// that a timeout extended since (the cache lags) is kept. An ended
// sandbox at its timeout costs the same two reads, once, and is removed.
func TestReaperCost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	keep := f.create("key-a", `{"templateID":"base","timeout":3600}`)
	pausing := f.create("key-a", `{"templateID":"base","timeout":10,"autoPause":true}`)
	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: podName(pausing, 0), Labels: map[string]string{LabelSandbox: pausing},
		Annotations: map[string]string{annGen: "0"}}, Spec: cryov1.CheckpointSpec{PodName: podName(pausing, 0), KeepRunning: ptr(false)}}
	if err := f.cl.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	ended := f.create("key-a", `{"templateID":"base","timeout":3600}`)
	p := f.pod("team-a", podName(ended, 0))
	p.Status.Phase = corev1.PodFailed
	if err := f.cl.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	extended := f.create("key-a", `{"templateID":"base","timeout":10}`)
	stale := staleCache(t, f)
	if code := f.do("key-a", "POST", "/sandboxes/"+extended+"/timeout", `{"timeout":3600}`, nil); code != http.StatusNoContent {
		t.Fatalf("timeout: %d", code)
	}

	f.now = f.now.Add(time.Minute)
	cc := &countingClient{Client: f.cl}
	srv := *f.srv
	srv.Client = cc
	r := &Reaper{Server: &srv, Cache: f.cl}
	reads := func() int32 { return cc.reads.Swap(0) }
	for range 20 {
		r.Reap(ctx)
	}
	if n := reads(); n != 0 {
		t.Errorf("20 ticks read the API server %d times, want 0", n)
	}
	for _, id := range []string{keep, pausing, extended, ended} {
		if p := f.pod("team-a", podName(id, 0)); p.DeletionTimestamp != nil {
			t.Errorf("sandbox %s reaped", id)
		}
	}

	// The cache from before the timeout was extended.
	r.Cache = stale
	r.Reap(ctx)
	if n := reads(); n != 2 {
		t.Errorf("a tick with one sandbox expired in the cache read the API server %d times, want 2 (its pods and Checkpoints)", n)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+extended, "", &d); code != 200 || d.State != "running" {
		t.Errorf("the sandbox whose timeout was extended after the cache's copy: %d %+v, want running", code, d)
	}

	// The ended sandbox's timeout: one tick reads it and removes it, the
	// next finds nothing to do.
	f.now = f.now.Add(time.Hour)
	for _, id := range []string{keep, extended} {
		if err := f.cl.Delete(ctx, f.pod("team-a", podName(id, 0))); err != nil {
			t.Fatal(err)
		}
	}
	r.Cache = f.cl
	r.Reap(ctx)
	if n := reads(); n != 2 {
		t.Errorf("the tick that removed an ended sandbox read the API server %d times, want 2", n)
	}
	f.removed(ended)
	r.Reap(ctx)
	if n := reads(); n != 0 {
		t.Errorf("the tick after read the API server %d times, want 0", n)
	}
}

// staleCache is a copy of the pods and Checkpoints f holds now, indexed
// as Gateway.Cache: a cache that has not seen what happens next.
func staleCache(t *testing.T, f *fixture) client.Reader {
	t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	var cps cryov1.CheckpointList
	if err := f.cl.List(ctx, &pods); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.List(ctx, &cps); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for i := range pods.Items {
		objs = append(objs, &pods.Items[i])
	}
	for i := range cps.Items {
		objs = append(objs, &cps.Items[i])
	}
	return fake.NewClientBuilder().WithScheme(f.cl.Scheme()).WithObjects(objs...).
		WithIndex(&corev1.Pod{}, IndexSandbox, sandboxOf).WithIndex(&cryov1.Checkpoint{}, IndexSandbox, sandboxOf).Build()
}

// TestListCost: Sandbox.list reads Server.Cache, which holds only the
// pods labelled controller.LabelRuntimeClass, and nothing of the API
// server, however many sandboxes the namespace has (it read two lists
// plus two per sandbox); it lists what the API server's reads listed:
// the key's namespace's running and paused sandboxes, not the ended
// ones, nor another namespace's. Without a cache, a list costs two
// reads.
func TestListCost(t *testing.T) {
	f := newFixture(t)
	var running []string
	for range 5 {
		running = append(running, f.create("key-a", `{"templateID":"base"}`))
	}
	paused := f.create("key-a", `{"templateID":"base"}`)
	f.controllerPauses("team-a", podName(paused, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+paused+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	ended := f.create("key-a", `{"templateID":"base"}`)
	f.podEnds("team-a", podName(ended, 0), corev1.PodFailed)
	foreign := f.create("key-b", `{"templateID":"base"}`)

	// What the API server's reads list, for comparison.
	var want, wantPaused []listedBody
	f.do("key-a", "GET", "/v2/sandboxes", "", &want)
	f.do("key-a", "GET", "/v2/sandboxes?state=paused", "", &wantPaused)

	cc := &countingClient{Client: f.cl}
	srv := *f.srv
	srv.Client, srv.Cache, srv.Keys = cc, labelledCache{f.cl}, f.cl
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f.url = ts.URL
	const n = 20
	for range n {
		var got []listedBody
		if code := f.do("key-a", "GET", "/v2/sandboxes", "", &got); code != 200 || !reflect.DeepEqual(got, want) {
			t.Fatalf("list from the cache: %d %+v, want %+v", code, got, want)
		}
	}
	if r := cc.reads.Swap(0); r != 0 {
		t.Errorf("%d lists read the API server %d times, want 0", n, r)
	}
	var got []listedBody
	if f.do("key-a", "GET", "/v2/sandboxes?state=paused", "", &got); len(got) != 1 || got[0].SandboxID != paused || !reflect.DeepEqual(got, wantPaused) {
		t.Errorf("paused: %+v", got)
	}
	ids := map[string]bool{}
	for _, d := range want {
		ids[d.SandboxID] = true
	}
	for _, id := range running {
		if !ids[id] {
			t.Errorf("running sandbox %s not listed", id)
		}
	}
	if len(want) != len(running)+1 || ids[ended] || ids[foreign] {
		t.Errorf("listed %v: want the %d running and the paused sandbox only", ids, len(running))
	}
	if f.do("key-b", "GET", "/v2/sandboxes", "", &got); len(got) != 1 || got[0].SandboxID != foreign {
		t.Errorf("key-b lists %+v, want its own sandbox only", got)
	}

	srv.Cache = nil
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &got); code != 200 || !reflect.DeepEqual(got, want) {
		t.Errorf("list without a cache: %d %+v", code, got)
	}
	if r := cc.reads.Swap(0); r != 2 {
		t.Errorf("a list without a cache read the API server %d times, want 2", r)
	}
}

// laggingCache plays the informer's cache over the store r: it shows each
// object only from the lag+1st read of it on (its event's lag behind the
// create).
type laggingCache struct {
	client.Reader
	lag   int
	mu    sync.Mutex
	reads map[string]int
}

func (c *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	k := fmt.Sprintf("%T %s", obj, key)
	c.reads[k]++
	n := c.reads[k]
	c.mu.Unlock()
	if n <= c.lag {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

// TestWaitCost: what the API server does while a call waits for a pod to
// run or a Checkpoint to finish, when the Server reads the cache (which
// shows each new object a few reads late): nothing for a create whose pod
// pends for 0.2 s and then sits on its node without an address for 2.5 s
// but the one list of its Events that diagnoses a pod refused on its
// node; one read for a pod deleted before it ran (the API server's
// NotFound, which alone fails the wait); for a pause that waits a second
// for its Checkpoint, the lookup's two lists and one read confirming the
// pod gone. A Checkpoint that failed is deleted and named as without the
// cache, and a pod the cache never shows is still seen to run, at a read
// every uncachedEvery. Reading the API server every poll() (10 ms here),
// the create cost some 270 reads, the deleted pod some 30, the pause
// some 100.
func TestWaitCost(t *testing.T) {
	f := newFixture(t)
	cc := &countingClient{Client: f.cl}
	lag := &laggingCache{Reader: f.cl, lag: 5, reads: map[string]int{}}
	srv := *f.srv
	srv.Client, srv.Keys, srv.Cache = cc, f.cl, lag
	srv.PollInterval, srv.StartWait = 10*time.Millisecond, 10*time.Second
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f.url = ts.URL
	ctx := context.Background()
	nextPod := func() string { return podName(fmt.Sprintf("sbx%d", f.ids.Load()+1), 0) }
	// kubelet plays the kubelet for pod ns/name, once the fixture's
	// cluster has made it pend: each step after its delay.
	type step struct {
		after time.Duration
		do    func(p *corev1.Pod) error
	}
	kubelet := func(name string, steps ...step) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				var p corev1.Pod
				if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: name}, &p); err == nil && p.Status.Phase == corev1.PodPending {
					break
				}
				time.Sleep(time.Millisecond)
			}
			for _, s := range steps {
				time.Sleep(s.after)
				var p corev1.Pod
				if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: name}, &p); err != nil {
					t.Error(err)
					return
				}
				if err := s.do(&p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		return done
	}
	onNode := step{200 * time.Millisecond, func(p *corev1.Pod) error {
		p.Spec.NodeName = "node-1"
		if err := f.cl.Update(ctx, p); err != nil {
			return err
		}
		p.Status.PodIP = ""
		return f.cl.Status().Update(ctx, p)
	}}
	runs := func(after time.Duration) step {
		return step{after, func(p *corev1.Pod) error {
			p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "127.0.0.1"
			return f.cl.Status().Update(ctx, p)
		}}
	}

	// A create whose pod takes 2.7 s to run.
	done := kubelet(nextPod(), onNode, runs(2500*time.Millisecond))
	cc.reads.Store(0)
	start := time.Now()
	id := f.create("key-a", `{"metadata":{"hang":"yes"}}`)
	<-done
	took := time.Since(start)
	if n := cc.reads.Load(); n > 1 {
		t.Errorf("a create whose pod ran after %s read the API server %d times, want at most 1 (its Events)", took.Round(time.Millisecond), n)
	}
	t.Logf("create, pod running after %s: %d reads", took.Round(time.Millisecond), cc.reads.Load())

	// A pod deleted while it pends.
	name := nextPod()
	done = kubelet(name, step{300 * time.Millisecond, func(p *corev1.Pod) error { return f.cl.Delete(ctx, p) }})
	cc.reads.Store(0)
	var e apiError
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"metadata":{"hang":"yes"}}`, &e); code != http.StatusBadGateway || !strings.Contains(e.Message, "pod "+name+" was deleted before it ran") {
		t.Errorf("create of a pod deleted while it pends: %d %+v", code, e)
	}
	<-done
	if n := cc.reads.Load(); n != 1 {
		t.Errorf("a pod deleted before it ran: %d reads, want 1", n)
	}

	// A pause whose Checkpoint takes a second.
	pod := podName(id, 0)
	paused := make(chan struct{})
	go func() {
		defer close(paused)
		for {
			var cp cryov1.Checkpoint
			if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: pod}, &cp); err == nil {
				time.Sleep(time.Second)
				cp.Status.Phase = cryov1.PhaseSucceeded
				if err := f.cl.Update(ctx, &cp); err != nil {
					t.Error(err)
				}
				if err := f.cl.Delete(ctx, f.pod("team-a", pod)); err != nil {
					t.Error(err)
				}
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	cc.reads.Store(0)
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Errorf("pause: %d", code)
	}
	<-paused
	if n := cc.reads.Load(); n != 3 {
		t.Errorf("a pause that waited a second for its Checkpoint: %d reads, want 3 (the lookup's 2, the pod's deletion confirmed)", n)
	}

	// A pause whose Checkpoint fails.
	id = f.create("key-a", `{}`)
	pod = podName(id, 0)
	go func() {
		for {
			var cp cryov1.Checkpoint
			if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: pod}, &cp); err == nil {
				cp.Status.Phase, cp.Status.Reason, cp.Status.Message = cryov1.PhaseFailed, "Boom", "the node said no"
				if err := f.cl.Update(ctx, &cp); err != nil {
					t.Error(err)
				}
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	cc.reads.Store(0)
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, &e); code != http.StatusInternalServerError ||
		e.Message != "pause of sandbox "+id+": Checkpoint "+pod+" failed: Boom: the node said no" {
		t.Errorf("pause whose Checkpoint failed: %d %+v", code, e)
	}
	if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: pod}, &cryov1.Checkpoint{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed Checkpoint: %v, want deleted", err)
	}
	if n := cc.reads.Load(); n != 2 {
		t.Errorf("a pause whose Checkpoint failed: %d reads, want 2 (the lookup's)", n)
	}

	// A cache that never shows the pod (its owner removed its label).
	lag.lag = 1 << 30
	done = kubelet(nextPod(), runs(300*time.Millisecond))
	cc.reads.Store(0)
	start = time.Now()
	f.create("key-a", `{"metadata":{"hang":"yes"}}`)
	<-done
	took = time.Since(start)
	if n := cc.reads.Load(); n != 1 || took < uncachedEvery {
		t.Errorf("a create whose pod the cache never shows: %d reads after %s, want 1 after %s", n, took.Round(time.Millisecond), uncachedEvery)
	}
}
