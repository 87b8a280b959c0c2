package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/cryo-runtime/cryo/controller"
	"github.com/cryo-runtime/cryo/e2bapi"
)

// requestLog records the requests a rest.Config's clients send.
type requestLog struct {
	mu   sync.Mutex
	reqs []*url.URL
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet {
			l.mu.Lock()
			l.reqs = append(l.reqs, r.URL)
			l.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// all are the GETs so far.
func (l *requestLog) all() []*url.URL {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// reads are the GETs since from (an index into the log) that are not
// watches and whose URL has one of the substrings.
func (l *requestLog) reads(from int, substrings ...string) (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, u := range l.reqs[from:] {
		if u.Query().Get("watch") == "true" {
			continue
		}
		for _, s := range substrings {
			if strings.Contains(u.String(), s) {
				out = append(out, u.String())
				break
			}
		}
	}
	return len(l.reqs), out
}

// testCaches checks the caches of a controller that setup built (with the
// E2B API and gateway at port gw) and that runs against a real
// kube-apiserver, every request of its clients in log. Its cache holds the
// labelled cryo pods and not a runc pod nor an unlabelled one, and asked
// the API server only for labelled pods; the gateway answers requests to a
// running sandbox, and to an unknown one, without reading the sandbox's
// pods or Checkpoint from the API server (testCosts shows a read the log
// sees), and stops serving a deleted pod as soon as its deletion reaches
// the cache.
func testCaches(t *testing.T, mgr manager.Manager, c client.Client, log *requestLog, gw int) {
	ctx := context.Background()
	// envd of the sandbox, at an address of the loopback network that
	// the pod's status names.
	const podIP = "127.83.0.1"
	envd, err := net.Listen("tcp", net.JoinHostPort(podIP, fmt.Sprint(e2bapi.EnvdPort)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "envd "+r.URL.Path)
	})}
	served := make(chan struct{})
	go func() { _ = srv.Serve(envd); close(served) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })

	cryo, runc := "cryo", "runc"
	pod := func(name string, class *string, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Labels: labels},
			Spec: corev1.PodSpec{RuntimeClassName: class, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The webhook is not reachable from envtest's API server: the pods
	// carry the label it would set.
	pod("web", &cryo, map[string]string{controller.LabelRuntimeClass: cryo})
	pod("plain", &runc, nil)
	pod("old-cryo", &cryo, nil)
	sbx := pod("e2b-sbx1-0", &cryo, map[string]string{controller.LabelRuntimeClass: cryo, e2bapi.LabelSandbox: "sbx1"})
	sbx.Status.Phase, sbx.Status.PodIP = corev1.PodRunning, podIP
	if err := c.Status().Update(ctx, sbx); err != nil {
		t.Fatalf("pod status with address %s: %v", podIP, err)
	}

	// (a) The cache: events arrive in order, so once the sandbox pod's
	// status is there, every pod created before it that the cache would
	// take is there too.
	var cached []string
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var pods corev1.PodList
		err := mgr.GetCache().List(ctx, &pods)
		cached = nil
		running := false
		for _, p := range pods.Items {
			cached = append(cached, p.Namespace+"/"+p.Name)
			running = running || p.Status.PodIP == podIP
		}
		if err == nil && running {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the cache does not show the sandbox pod running within 30s: %v, pods %v", err, cached)
		}
	}
	sort.Strings(cached)
	if strings.Join(cached, " ") != "team-a/e2b-sbx1-0 team-a/web" {
		t.Errorf("the controller's cache holds pods %v, want team-a/e2b-sbx1-0 and team-a/web only", cached)
	}
	// The selection is the API server's: no list or watch asked for
	// every pod. (client-go may list by a watch that sends the initial
	// state.)
	cacheReads := 0
	for _, u := range log.all() {
		if !strings.HasSuffix(u.Path, "/pods") {
			continue // a pod read by name: the reconciler's of a pod it does not cache
		}
		if u.Path != "/api/v1/pods" || u.Query().Get("labelSelector") != controller.LabelRuntimeClass+" in (cryo)" {
			// such as the E2B reaper's list of the sandboxes' pods every
			// tick, before it read the cache
			t.Errorf("pod collection read %s: not the cache's of pods labelled with a cryo class", u)
			continue
		}
		cacheReads++
	}
	if cacheReads == 0 {
		t.Error("no list or watch of labelled pods logged: the log misses the cache's requests")
	}

	// (b) The gateway: 20 requests to the running sandbox.
	send := func(id string) (int, string) {
		return sandboxGet(t, fmt.Sprintf("http://127.0.0.1:%d/health", gw), id)
	}
	mark, _ := log.reads(0)
	for range 20 {
		if code, body := send("sbx1"); code != 200 || body != "envd /health" {
			t.Fatalf("gateway request to the running sandbox: %d %q", code, body)
		}
	}
	next, reads := log.reads(mark, "sbx1")
	if len(reads) != 0 {
		t.Errorf("20 gateway requests to a running sandbox read from the API server: %v", reads)
	}
	t.Logf("20 gateway requests to a running sandbox: %d reads of its pods or Checkpoint (%d GETs of any kind meanwhile)", len(reads), next-mark)
	if code, body := send("sbx2"); code != http.StatusBadGateway || !strings.Contains(body, "not found") {
		t.Errorf("gateway request to an unknown sandbox: %d %q", code, body)
	}
	if _, reads := log.reads(next, "sbx2"); len(reads) != 0 {
		t.Errorf("a request for an unknown sandbox read the API server: %v", reads)
	}

	// A pod of another namespace with the sandbox's id, which the label
	// guard would have refused to anyone but the controller (this test's
	// identity): the id is refused while both hold it.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}}); err != nil {
		t.Fatal(err)
	}
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "e2b-sbx1-3",
		Labels:      map[string]string{controller.LabelRuntimeClass: cryo, e2bapi.LabelSandbox: "sbx1"},
		Annotations: map[string]string{"e2b.cryo.dev/generation": "3"}},
		Spec: corev1.PodSpec{RuntimeClassName: &cryo, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	foreign.Status.Phase, foreign.Status.PodIP = corev1.PodRunning, "127.83.0.2"
	if err := c.Status().Update(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	until := func(what string, ok func(int, string) bool) {
		t.Helper()
		var code int
		var body string
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if code, body = send("sbx1"); ok(code, body) {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s: gateway answers %d %q", what, code, body)
			}
		}
	}
	until("a foreign pod of the id in team-b", func(code int, body string) bool {
		return code == http.StatusBadGateway && strings.Contains(body, "more than one namespace")
	})
	if err := c.Delete(ctx, foreign, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	until("the foreign pod deleted", func(code int, body string) bool { return code == 200 && body == "envd /health" })

	// A deleted pod is served until its deletion reaches the cache (the
	// informer's lag), not a moment longer.
	if err := c.Delete(ctx, sbx, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for {
		var p corev1.Pod
		err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(sbx), &p)
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil || time.Since(deleted) > 10*time.Second {
			t.Fatalf("the deleted pod still cached %s after its deletion: %v", time.Since(deleted), err)
		}
		time.Sleep(time.Millisecond)
	}
	lag := time.Since(deleted)
	if code, body := send("sbx1"); code != http.StatusBadGateway || !strings.Contains(body, "not found") {
		t.Errorf("request once the deletion is cached: %d %q, want not found", code, body)
	}
	t.Logf("the deleted sandbox pod left the cache %s after the API server took the deletion; the next request was refused", lag.Round(100*time.Microsecond))
}

// sandboxGet GETs u as a request to sandbox id (E2B's sandbox header) and
// returns the status and the body.
func sandboxGet(t *testing.T, u, id string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
