package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
	"github.com/cryo-runtime/cryo/e2bapi"
)

// The E2B annotations the reaper reads (e2bapi's own are unexported).
const (
	annEndAt     = "e2b.cryo.dev/end-at"
	annAutoPause = "e2b.cryo.dev/auto-pause"
	annGen       = "e2b.cryo.dev/generation"
)

// testCosts measures what the E2B paths that need no API key, or any
// key, cost the API server, with every request of the controller's
// clients in log: the gateway's requests for ids that name no sandbox,
// the reaper's ticks and requests with made-up API keys cost nothing; a
// request for a paused sandbox costs one read of a pod by name; a
// sandbox the reaper ends costs one read of its namespace's objects;
// Sandbox.list reads nothing, however many sandboxes it lists. The
// controller was set up with the reaper every reapEvery.
func testCosts(t *testing.T, mgr manager.Manager, c client.Client, log *requestLog, gw int, api string, reapEvery time.Duration) {
	ctx := context.Background()
	cryo := "cryo"
	sandbox := func(id string, ann map[string]string) *corev1.Pod {
		t.Helper()
		ann[annGen] = "0"
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "e2b-" + id + "-0",
			Labels:      map[string]string{controller.LabelRuntimeClass: cryo, e2bapi.LabelSandbox: id},
			Annotations: ann},
			Spec: corev1.PodSpec{RuntimeClassName: &cryo, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cached := func(o client.Object, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(o), o); err == nil && ok() {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s not in the cache as expected after 10s", o.GetName())
			}
		}
	}
	// storeReads are the reads of pods and Checkpoints, and those that
	// name one of ids, since mark.
	storeReads := func(mark int, ids ...string) []string {
		_, reads := log.reads(mark, append([]string{"/pods", "/checkpoints"}, ids...)...)
		return reads
	}
	now := time.Now()
	at := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339Nano) }

	// The wired reaper (every reapEvery, on the real clock) kills an
	// expired sandbox: it runs, over the manager's cache.
	gone := sandbox("expired1", map[string]string{annEndAt: at(-time.Minute)})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := c.Get(ctx, client.ObjectKeyFromObject(gone), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the reaper did not kill an expired sandbox within 10s: %v", err)
		}
	}

	// Sandboxes for the rest: running with an hour left, one whose end
	// is in 30 minutes, one paused.
	sandbox("running1", map[string]string{annEndAt: at(time.Hour)})
	soon := sandbox("soon1", map[string]string{annEndAt: at(30 * time.Minute)})
	paused := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "e2b-paused1-0",
		Labels: map[string]string{e2bapi.LabelSandbox: "paused1"}, Annotations: map[string]string{annGen: "0"}},
		Spec: cryov1.CheckpointSpec{PodName: "e2b-paused1-0"}}
	if err := c.Create(ctx, paused); err != nil {
		t.Fatal(err)
	}
	// A merge patch, not an update: the reconciler may fail the
	// Checkpoint first (its pod is missing); Succeeded wins either way,
	// and a finished Checkpoint is left alone.
	if err := c.Status().Patch(ctx, paused, client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Succeeded"}}`))); err != nil {
		t.Fatal(err)
	}
	cached(soon, func() bool { return true })
	cached(paused, func() bool { return paused.Status.Phase == cryov1.PhaseSucceeded })
	time.Sleep(200 * time.Millisecond) // the reconciler's reads of it done

	// (a) The gateway: N requests for ids that name no sandbox.
	const n = 50
	send := func(id string) (int, string) {
		return sandboxGet(t, fmt.Sprintf("http://127.0.0.1:%d/health", gw), id)
	}
	mark, _ := log.reads(0)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("madeup%d", i)
		ids = append(ids, id)
		if code, body := send(id); code != http.StatusBadGateway || !strings.Contains(body, "not found") {
			t.Fatalf("gateway request for %s: %d %q", id, code, body)
		}
	}
	if reads := storeReads(mark, ids...); len(reads) != 0 {
		t.Errorf("%d gateway requests for unknown ids read the API server %d times: %v", n, len(reads), reads)
	}
	next, _ := log.reads(0)
	t.Logf("%d gateway requests for unknown ids: %d reads of pods or Checkpoints (%d GETs of any kind meanwhile)", n, len(storeReads(mark, ids...)), next-mark)

	// A paused sandbox: one read, of the pod a resume would make.
	mark = next
	if code, body := send("paused1"); code != http.StatusBadGateway || !strings.Contains(body, "paused") {
		t.Errorf("gateway request for a paused sandbox: %d %q", code, body)
	}
	if reads := storeReads(mark, "paused1"); len(reads) != 1 || !strings.HasSuffix(reads[0], "/namespaces/team-a/pods/e2b-paused1-1") {
		t.Errorf("a gateway request for a paused sandbox read %v, want its next pod by name only", reads)
	}
	next, _ = log.reads(0)

	// (b) The reaper: M ticks over the manager's cache, on a clock 10
	// minutes ahead (no end has passed); then one 31 minutes ahead, when
	// soon1's has.
	const m = 20
	srv := &e2bapi.Server{Client: newLoggedClient(t, mgr), Namespace: "cryo-system", RuntimeClass: cryo, Log: testr.New(t),
		Now: func() time.Time { return now.Add(10 * time.Minute) }}
	r := &e2bapi.Reaper{Server: srv, Cache: mgr.GetCache()}
	mark = next
	for range m {
		r.Reap(ctx)
	}
	if reads := storeReads(mark); len(reads) != 0 {
		t.Errorf("%d reaper ticks read the API server %d times: %v", m, len(reads), reads)
	}
	t.Logf("%d reaper ticks, 3 sandboxes, none expired: %d reads of pods or Checkpoints", m, len(storeReads(mark)))
	srv.Now = func() time.Time { return now.Add(31 * time.Minute) }
	mark, _ = log.reads(0)
	r.Reap(ctx)
	if err := c.Get(ctx, client.ObjectKeyFromObject(soon), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the expired sandbox soon1 after a tick: %v, want killed", err)
	}
	acted := storeReads(mark)
	if len(acted) != 2 {
		t.Errorf("the tick that killed soon1 read %v, want its namespace's pods and Checkpoints of its id", acted)
	}
	t.Logf("the tick that ended a sandbox: %d reads (%v)", len(acted), acted)

	// The wired reaper, over a stretch of its ticks, reads nothing either.
	mark, _ = log.reads(0)
	time.Sleep(20 * reapEvery)
	if reads := storeReads(mark); len(reads) != 0 {
		t.Errorf("the controller's reaper read the API server over about 20 ticks: %v", reads)
	}

	// (c) The API: N requests with made-up keys, then one with a key.
	key := "cost-test-key"
	sum := sha256.Sum256([]byte(key))
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: "team-a-key",
		Labels:      map[string]string{e2bapi.LabelAPIKey: hex.EncodeToString(sum[:])[:63]},
		Annotations: map[string]string{e2bapi.AnnotationKeyNamespace: "team-a"}},
		Data: map[string][]byte{e2bapi.SecretKeyField: []byte(key)}}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	call := func(key string) int {
		req, _ := http.NewRequest("GET", "http://"+api+"/v2/sandboxes", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	until := func(what string, want int) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); call(key) != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not %d after 10s", what, want)
			}
		}
	}
	until("a new key", http.StatusOK)
	secretReads := func(mark int) []string {
		var out []string
		for _, u := range log.all()[mark:] {
			if strings.HasSuffix(u.Path, "/secrets") && u.Query().Get("watch") != "true" {
				out = append(out, u.String())
			}
		}
		return out
	}
	// The key cache's own list and watch: the log sees it, and it asks
	// for the key Secrets only.
	keyCache := 0
	for _, u := range log.all() {
		if u.Path == "/api/v1/namespaces/cryo-system/secrets" && u.Query().Get("labelSelector") == e2bapi.LabelAPIKey {
			keyCache++
		}
	}
	if keyCache == 0 {
		t.Error("no list or watch of the key Secrets logged: the log misses the key cache's requests")
	}
	mark, _ = log.reads(0)
	for i := range n {
		if code := call(fmt.Sprintf("made-up-%d", i)); code != http.StatusUnauthorized {
			t.Fatalf("a made-up key: %d", code)
		}
	}
	if code := call(key); code != http.StatusOK {
		t.Errorf("the key: %d", code)
	}
	if reads := secretReads(mark); len(reads) != 0 {
		t.Errorf("%d requests with made-up keys and one with a key listed Secrets %d times: %v", n, len(reads), reads)
	}
	t.Logf("%d requests with made-up keys, 1 with a key: %d Secret lists", n, len(secretReads(mark)))

	// (d) Sandbox.list with the key: N lists of team-a's sandboxes (the
	// running, the paused, and one whose pod ended, which is not listed)
	// from the manager's cache.
	ended := sandbox("ended1", map[string]string{annEndAt: at(2 * time.Hour)})
	ended.Status.Phase = corev1.PodFailed
	if err := c.Status().Update(ctx, ended); err != nil {
		t.Fatal(err)
	}
	cached(ended, func() bool { return ended.Status.Phase == corev1.PodFailed })
	time.Sleep(200 * time.Millisecond) // the reconciler's reads of it done
	list := func() map[string]string {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+api+"/v2/sandboxes", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l []struct{ SandboxID, State string }
		if err := json.NewDecoder(resp.Body).Decode(&l); resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("list: %d %v", resp.StatusCode, err)
		}
		out := map[string]string{}
		for _, d := range l {
			out[d.SandboxID] = d.State
		}
		return out
	}
	mark, _ = log.reads(0)
	for range n {
		if got := list(); got["running1"] != "running" || got["paused1"] != "paused" || got["ended1"] != "" || got["soon1"] != "" {
			t.Fatalf("Sandbox.list of team-a: %v, want running1 running, paused1 paused, and neither ended1 nor soon1 (killed)", got)
		}
	}
	if reads := storeReads(mark); len(reads) != 0 {
		t.Errorf("%d lists read the API server %d times: %v", n, len(reads), reads)
	}
	t.Logf("%d Sandbox.list calls (team-a: 2 sandboxes listed, 1 ended): %d reads of pods or Checkpoints", n, len(storeReads(mark)))

	// (e) Waits, with the key: a create whose pod is on its node at once
	// and runs 3 s later (the test plays the kubelet), then a pause of
	// it, which the controller's reconciler fails (no kubelet here).
	testWaitCosts(t, c, log, api, key)
	if err := c.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	until("the key's Secret deleted", http.StatusUnauthorized)
	t.Logf("the deleted key refused %s after its deletion", time.Since(deleted).Round(time.Millisecond))
}

// newLoggedClient is an uncached client of the manager's config: its
// requests are in the log.
func newLoggedClient(t *testing.T, mgr manager.Manager) client.Client {
	t.Helper()
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testWaitCosts: a call waiting for its pod to run, or for its
// Checkpoint, reads the manager's cache (which shows a new object only
// once its event arrives), not the API server: a create whose pod sits
// on its node without an address for 3 s reads the pod never and lists
// its Events at most once (the diagnosis of a pod the runtime refuses);
// a pause reads the sandbox's objects once (lookup) and its Checkpoint
// never, and a Checkpoint that failed is deleted and named as before.
// Reading the API server every poll() (250 ms), the create cost 13 reads
// of its pod and 2 Event lists, the pause a read of its Checkpoint every
// poll() until it failed (2 here).
func testWaitCosts(t *testing.T, c client.Client, log *requestLog, api, key string) {
	ctx := context.Background()
	const podIP = "127.83.0.2"
	envd, err := net.Listen("tcp", net.JoinHostPort(podIP, fmt.Sprint(e2bapi.EnvdPort)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })}
	served := make(chan struct{})
	go func() { _ = srv.Serve(envd); close(served) }()
	defer func() { _ = srv.Close(); <-served }()
	do := func(method, path, body string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+api+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatalf("%s %s: %d: %v", method, path, resp.StatusCode, err)
			}
		}
		return resp.StatusCode
	}

	// The kubelet: binds the pod at once, runs it 3 s later.
	const pending = 3 * time.Second
	kubelet := make(chan error, 1)
	go func() {
		kubelet <- func() error {
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				var pods corev1.PodList
				if err := c.List(ctx, &pods, client.InNamespace("team-a")); err != nil {
					return err
				}
				for _, p := range pods.Items {
					if p.Annotations["e2b.cryo.dev/metadata"] != `{"cost":"wait"}` {
						continue
					}
					b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
					if err := c.SubResource("binding").Create(ctx, &p, b); err != nil {
						return fmt.Errorf("bind: %w", err)
					}
					time.Sleep(pending)
					if err := c.Get(ctx, client.ObjectKeyFromObject(&p), &p); err != nil {
						return err
					}
					p.Status.Phase, p.Status.PodIP = corev1.PodRunning, podIP
					return c.Status().Update(ctx, &p)
				}
			}
			return errors.New("no pod created within 10s")
		}()
	}()
	mark, _ := log.reads(0)
	start := time.Now()
	var sb struct{ SandboxID string }
	code := do("POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"cost":"wait"}}`, &sb)
	took := time.Since(start)
	if err := <-kubelet; err != nil {
		t.Fatal(err)
	}
	if code != http.StatusCreated || sb.SandboxID == "" {
		t.Fatalf("create: %d %+v", code, sb)
	}
	pod := "e2b-" + sb.SandboxID + "-0"
	_, podReads := log.reads(mark, "/pods/"+pod)
	_, events := log.reads(mark, "/events")
	if len(podReads) != 0 || len(events) > 1 || took < pending {
		t.Errorf("a create whose pod ran after %s (answered after %s) read its pod %d times and listed Events %d times, want 0 and at most 1: %v %v",
			pending, took.Round(time.Millisecond), len(podReads), len(events), podReads, events)
	}
	t.Logf("a create whose pod ran after %s: %d reads of the pod, %d Event lists", took.Round(time.Millisecond), len(podReads), len(events))

	mark, _ = log.reads(0)
	var e struct{ Message string }
	code = do("POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`, &e)
	if code != http.StatusInternalServerError || !strings.Contains(e.Message, "Checkpoint "+pod+" failed: ") {
		t.Errorf("pause with no kubelet: %d %q, want the Checkpoint's failure", code, e.Message)
	}
	_, reads := log.reads(mark, sb.SandboxID)
	if len(reads) != 2 {
		t.Errorf("the pause read %v, want the lookup's pods and Checkpoints of the id only", reads)
	}
	t.Logf("a pause whose Checkpoint failed (%s): %d reads (%v)", e.Message, len(reads), reads)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := c.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: pod}, &cryov1.Checkpoint{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the failed Checkpoint not deleted within 10s: %v", err)
		}
	}
	if code := do("DELETE", "/sandboxes/"+sb.SandboxID, "", nil); code != http.StatusNoContent {
		t.Errorf("kill: %d", code)
	}
}
