package e2bapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

type fixture struct {
	t   *testing.T
	cl  client.Client
	srv *Server
	url string
	ids atomic.Int32
	now time.Time

	// envd: what /init was sent, and what it answers.
	mu       sync.Mutex
	inits    []initBody
	initCode atomic.Int32
}

func newFixture(t *testing.T) *fixture {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := cryov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	key := func(name, ns, k string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: name, Labels: map[string]string{LabelAPIKey: ""},
				Annotations: map[string]string{AnnotationKeyNamespace: ns}},
			Data: map[string][]byte{SecretKeyField: []byte(k)},
		}
	}
	f := &fixture{t: t, now: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)}
	f.cl = fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		key("team-a", "team-a", "key-a"), key("team-b", "team-b", "key-b"),
		// a Secret without the label is no key
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: "other"}, Data: map[string][]byte{SecretKeyField: []byte("key-x")}},
	).WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
		return []string{o.(*corev1.Event).InvolvedObject.Name}
	}).WithIndex(&corev1.Pod{}, IndexSandbox, sandboxOf).WithIndex(&cryov1.Checkpoint{}, IndexSandbox, sandboxOf).Build()
	f.srv = &Server{
		Client: f.cl, Namespace: "cryo-system", RuntimeClass: "cryo", DefaultStore: "s3://snapshots/cryo",
		Templates:    map[string]Template{"base": {Image: "busybox:1", Command: []string{"sleep", "inf"}}},
		Log:          logr.Discard(),
		Now:          func() time.Time { return f.now },
		NewID:        func() string { return fmt.Sprintf("sbx%d", f.ids.Add(1)) },
		PollInterval: time.Millisecond,
		PauseWait:    5 * time.Second,
		StartWait:    5 * time.Second,
	}
	f.initCode.Store(http.StatusNoContent)
	envd := httptest.NewServer(http.HandlerFunc(f.envd))
	t.Cleanup(envd.Close)
	u, _ := url.Parse(envd.URL)
	f.srv.EnvdPort, _ = strconv.Atoi(u.Port())
	ts := httptest.NewServer(f.srv.Handler())
	t.Cleanup(ts.Close)
	f.url = ts.URL
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go f.cluster(ctx, done)
	return f
}

// envd plays the guest's envd: it records /init.
func (f *fixture) envd(w http.ResponseWriter, r *http.Request) {
	var b initBody
	if r.Method != "POST" || r.URL.Path != "/init" || json.NewDecoder(r.Body).Decode(&b) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.inits = append(f.inits, b)
	f.mu.Unlock()
	w.WriteHeader(int(f.initCode.Load()))
}

func (f *fixture) lastInit() initBody {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.inits) == 0 {
		f.t.Fatal("envd got no /init")
	}
	return f.inits[len(f.inits)-1]
}

// cluster plays the kubelet (every new pod runs at 127.0.0.1, where the
// fake envd listens) and the Checkpoint controller for keepRunning true
// (Succeeded at once) until ctx ends. A sandbox with metadata fail=yes
// fails, one with refuse=yes has its container refused.
func (f *fixture) cluster(ctx context.Context, done chan struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		var pods corev1.PodList
		if f.cl.List(ctx, &pods) == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.Status.Phase != "" {
					continue
				}
				p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "127.0.0.1"
				switch p.Annotations[annMetadata] {
				case `{"fail":"yes"}`:
					p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Boom"
				case `{"refuse":"yes"}`: // the runtime refuses the container
					p.Status.Phase, p.Status.PodIP = corev1.PodPending, ""
					p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "sandbox", State: corev1.ContainerState{
						Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: "unknown cryo annotation"}}}}
				case `{"hang":"yes"}`: // never scheduled
					p.Status.Phase = corev1.PodPending
				case `{"refuse":"sandbox"}`: // as cryo refuses a bad pod annotation: only an Event
					p.Status.Phase, p.Status.PodIP = corev1.PodPending, ""
					p.Spec.NodeName = "node-1"
					_ = f.cl.Update(ctx, p)
					_ = f.cl.Create(ctx, &corev1.Event{
						ObjectMeta:     metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name + ".1"},
						InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
						Reason:         "FailedCreatePodSandBox", Type: "Warning",
						Message: `Failed to create pod sandbox: rpc error: code = InvalidArgument desc = failed to create shim task: annotation cryo.dev/x="y": unknown cryo annotation`,
					})
				}
				_ = f.cl.Status().Update(ctx, p)
			}
		}
		var cps cryov1.CheckpointList
		if f.cl.List(ctx, &cps) == nil {
			for i := range cps.Items {
				c := &cps.Items[i]
				if c.Status.Phase == "" && c.Spec.KeepRunning != nil && *c.Spec.KeepRunning {
					c.Status.Phase = cryov1.PhaseSucceeded
					_ = f.cl.Update(ctx, c)
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// do sends a request as the SDK does and decodes the answer into out.
func (f *fixture) do(key, method, path, body string, out any) int {
	f.t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			f.t.Fatalf("%s %s: decode the answer (%d): %v", method, path, resp.StatusCode, err)
		}
	}
	return resp.StatusCode
}

func (f *fixture) create(key, body string) string {
	f.t.Helper()
	return f.createSandbox(key, body).SandboxID
}

func (f *fixture) createSandbox(key, body string) sandboxBody {
	f.t.Helper()
	var sb sandboxBody
	if code := f.do(key, "POST", "/v2/sandboxes", body, &sb); code != http.StatusCreated {
		f.t.Fatalf("create %s: %d", body, code)
	}
	if sb.SandboxID == "" || sb.EnvdVersion != "0.5.7" || sb.EnvdAccessToken == nil || len(*sb.EnvdAccessToken) != 64 {
		f.t.Fatalf("create answered %+v", sb)
	}
	return sb
}

func (f *fixture) pod(ns, name string) *corev1.Pod {
	f.t.Helper()
	var p corev1.Pod
	if err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		f.t.Fatal(err)
	}
	return &p
}

// controllerPauses plays the Checkpoint controller: it completes the
// Checkpoint of pod ns/name and deletes the pod, as keepRunning false does.
func (f *fixture) controllerPauses(ns, name string) {
	go func() {
		ctx := context.Background()
		for {
			var cp cryov1.Checkpoint
			if err := f.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cp); err == nil {
				cp.Status.Phase = cryov1.PhaseSucceeded
				if err := f.cl.Update(ctx, &cp); err == nil {
					_ = f.cl.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	for _, key := range []string{"", "nope", "key-x"} {
		var e apiError
		if code := f.do(key, "GET", "/v2/sandboxes", "", &e); code != http.StatusUnauthorized || e.Code != 401 || e.Message == "" {
			t.Errorf("key %q: %d %+v, want 401 in E2B's error shape", key, code, e)
		}
	}
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != http.StatusOK || len(list) != 0 {
		t.Errorf("good key: %d %v", code, list)
	}
}

func TestCreateGetListKill(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{"templateID":"base","timeout":60,"metadata":{"user":"ann","k y":"v=1"},"envVars":{"FOO":"bar"},"autoPause":true}`)
	p := f.pod("team-a", podName(id, 0))
	if *p.Spec.RuntimeClassName != "cryo" || p.Labels[LabelSandbox] != id || p.Spec.Containers[0].Image != "busybox:1" {
		t.Errorf("pod %+v", p)
	}
	noShimAnnotations(t, p)
	// The pause's target, without the webhook (which may not answer in
	// time and lets the pod through).
	if got, want := p.Annotations[controller.AnnotationCheckpointTo], "s3://snapshots/cryo/team-a/pods:pod-"+podName(id, 0); got != want {
		t.Errorf("pod's %s %q, want %q", controller.AnnotationCheckpointTo, got, want)
	}
	if e := p.Spec.Containers[0].Env; len(e) != 1 || e[0].Name != "FOO" || e[0].Value != "bar" {
		t.Errorf("env %v", e)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != http.StatusOK {
		t.Fatalf("get: %d", code)
	}
	if d.SandboxID != id || d.TemplateID != "base" || d.State != "running" || d.Metadata["user"] != "ann" ||
		d.EndAt != "2026-12-05T12:01:00Z" || d.Lifecycle.OnTimeout != "pause" {
		t.Errorf("get: %+v", d)
	}
	other := f.create("key-a", `{"templateID":"base","metadata":{"user":"bob"}}`)

	// The SDK's metadata filter: URLSearchParams of encoded pairs.
	filter := url.Values{url.QueryEscape("k y"): {url.QueryEscape("v=1")}}.Encode()
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes?state=running,paused&metadata="+url.QueryEscape(filter), "", &list); code != 200 || len(list) != 1 || list[0].SandboxID != id {
		t.Errorf("list by metadata: %d %+v", code, list)
	}
	if code := f.do("key-a", "GET", "/v2/sandboxes?state=paused", "", &list); code != 200 || len(list) != 0 {
		t.Errorf("list paused: %d %+v", code, list)
	}

	// Another namespace's key sees nothing of team-a.
	var e apiError
	for _, req := range [][2]string{{"GET", "/sandboxes/" + id}, {"DELETE", "/sandboxes/" + id}, {"POST", "/sandboxes/" + id + "/pause"}} {
		if code := f.do("key-b", req[0], req[1], "", &e); code != http.StatusNotFound || e.Code != 404 {
			t.Errorf("key-b %s %s: %d %+v", req[0], req[1], code, e)
		}
	}
	if code := f.do("key-b", "GET", "/v2/sandboxes", "", &list); code != 200 || len(list) != 0 {
		t.Errorf("key-b list: %+v", list)
	}

	if code := f.do("key-a", "DELETE", "/sandboxes/"+id, "", nil); code != http.StatusNoContent {
		t.Errorf("kill: %d", code)
	}
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &e); code != http.StatusNotFound {
		t.Errorf("get after kill: %d", code)
	}
	if code := f.do("key-a", "DELETE", "/sandboxes/"+id, "", &e); code != http.StatusNotFound {
		t.Errorf("second kill: %d", code)
	}
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != 200 || len(list) != 1 || list[0].SandboxID != other {
		t.Errorf("list after kill: %+v", list)
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`) // the SDK's default template is base
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v2/sandboxes", `{"templateID":"nope"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","timeout":-1}`},
		{"POST", "/v2/sandboxes", `{"templateID":`},
		{"PUT", "/sandboxes/" + id + "/network", `{}`},
		{"POST", "/v3/templates", `{}`},
		{"GET", "/volumes", ""},
		{"GET", "/v2/sandboxes?state=dead", ""},
	} {
		var e apiError
		code := f.do("key-a", c.method, c.path, c.body, &e)
		if code < 400 || e.Code != code || e.Message == "" {
			t.Errorf("%s %s %s: %d %+v, want an E2B error", c.method, c.path, c.body, code, e)
		}
	}
}

func TestTimeoutAndReap(t *testing.T) {
	f := newFixture(t)
	kill := f.create("key-a", `{"templateID":"base","timeout":10}`)
	pause := f.create("key-a", `{"templateID":"base","timeout":10,"autoPause":true}`)
	keep := f.create("key-a", `{"templateID":"base","timeout":10}`)
	if code := f.do("key-a", "POST", "/sandboxes/"+keep+"/timeout", `{"timeout":3600}`, nil); code != http.StatusNoContent {
		t.Fatalf("timeout: %d", code)
	}
	if code := f.do("key-b", "POST", "/sandboxes/"+keep+"/timeout", `{"timeout":1}`, nil); code != http.StatusNotFound {
		t.Fatalf("timeout with another namespace's key: %d", code)
	}
	f.now = f.now.Add(time.Minute)
	f.controllerPauses("team-a", podName(pause, 0))
	(&Reaper{Server: f.srv, Cache: f.cl}).Reap(context.Background())
	var e apiError
	if code := f.do("key-a", "GET", "/sandboxes/"+kill, "", &e); code != http.StatusNotFound {
		t.Errorf("expired sandbox: %d, want killed", code)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+keep, "", &d); code != 200 || d.State != "running" {
		t.Errorf("extended sandbox: %d %+v", code, d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.do("key-a", "GET", "/sandboxes/"+pause, "", &d)
		if d.State == "paused" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("autoPause sandbox: %+v, want paused", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPauseConnect(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{"templateID":"base","metadata":{"turn":"1"},"envVars":{"FOO":"bar"}}`)
	var sb sandboxBody
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":60}`, &sb); code != http.StatusOK || sb.SandboxID != id {
		t.Fatalf("connect to a running sandbox: %d %+v", code, sb)
	}
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	var cp cryov1.Checkpoint
	if err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: podName(id, 0)}, &cp); err != nil {
		t.Fatal(err)
	}
	if cp.Spec.PodName != podName(id, 0) || cp.Spec.KeepRunning == nil || *cp.Spec.KeepRunning || cp.Labels[LabelSandbox] != id {
		t.Errorf("Checkpoint %+v", cp)
	}
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, &e); code != http.StatusConflict {
		t.Errorf("second pause: %d, want 409 (the SDK's 'already paused')", code)
	}
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes?state=paused", "", &list); code != 200 || len(list) != 1 || list[0].State != "paused" || list[0].Metadata["turn"] != "1" {
		t.Errorf("list paused: %+v", list)
	}
	if code := f.do("key-b", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, &e); code != http.StatusNotFound {
		t.Errorf("connect with another namespace's key: %d", code)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":60}`, &sb); code != http.StatusCreated || sb.SandboxID != id {
		t.Fatalf("connect to a paused sandbox: %d %+v", code, sb)
	}
	p := f.pod("team-a", podName(id, 1))
	noShimAnnotations(t, p)
	if p.Annotations[controller.AnnotationRestoreCheckpoint] != podName(id, 0) || p.Labels[LabelSandbox] != id ||
		p.Spec.Containers[0].Env[0].Value != "bar" {
		t.Errorf("resumed pod %+v", p.ObjectMeta)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "running" || d.Metadata["turn"] != "1" {
		t.Errorf("after connect: %d %+v", code, d)
	}
	// A second pause checkpoints the new pod under the next name.
	f.controllerPauses("team-a", podName(id, 1))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", ``, nil); code != http.StatusNoContent {
		t.Fatalf("second pause: %d", code)
	}
	if code := f.do("key-a", "DELETE", "/sandboxes/"+id, "", nil); code != http.StatusNoContent {
		t.Fatalf("kill paused: %d", code)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps, client.InNamespace("team-a")); err != nil || len(cps.Items) != 0 {
		t.Errorf("Checkpoints after kill: %v %d", err, len(cps.Items))
	}
}

func TestPauseFailed(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	go func() {
		ctx := context.Background()
		for {
			var cp cryov1.Checkpoint
			if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: podName(id, 0)}, &cp); err == nil {
				cp.Status.Phase, cp.Status.Reason, cp.Status.Message = cryov1.PhaseFailed, cryov1.ReasonKubeletFailed, "boom"
				if f.cl.Update(ctx, &cp) == nil {
					return
				}
			} else if !apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, &e); code != 500 || !strings.Contains(e.Message, "KubeletFailed: boom") {
		t.Errorf("failed pause: %d %+v", code, e)
	}
	// The sandbox runs on, and no failed Checkpoint blocks the next pause.
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "running" {
		t.Errorf("after a failed pause: %d %+v", code, d)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps, client.InNamespace("team-a")); err != nil || len(cps.Items) != 0 {
		t.Errorf("Checkpoints after a failed pause: %v %d", err, len(cps.Items))
	}
}

// noShimAnnotations fails when the API put an annotation under cryo.dev/
// on a pod other than the restore by name: the shim refuses a pod with a
// cryo.dev/ annotation it does not know (annotations.Parse).
func noShimAnnotations(t *testing.T, p *corev1.Pod) {
	t.Helper()
	for k := range p.Annotations {
		if strings.HasPrefix(k, "cryo.dev/") && k != controller.AnnotationRestoreCheckpoint && k != AnnotationEnvdTokenSHA256 && k != controller.AnnotationCheckpointTo {
			t.Errorf("pod %s: annotation %s is under the shim's prefix cryo.dev/", p.Name, k)
		}
	}
}

// TestListPaging: the SDK's limit and nextToken (X-Next-Token), newest
// first unless order asc, and its template and startedAfter filters.
func TestListPaging(t *testing.T) {
	f := newFixture(t)
	var ids []string
	for range 3 {
		ids = append(ids, f.create("key-a", `{}`))
		f.now = f.now.Add(time.Second)
	}
	got := func(l []listedBody) (out []string) {
		for _, d := range l {
			out = append(out, d.SandboxID)
		}
		return out
	}
	var p1, p2 []listedBody
	next := f.page("key-a", "/v2/sandboxes?limit=2", &p1)
	last := f.page("key-a", "/v2/sandboxes?limit=2&nextToken="+url.QueryEscape(next), &p2)
	if fmt.Sprint(got(p1), got(p2)) != fmt.Sprint([]string{ids[2], ids[1]}, []string{ids[0]}) || next == "" || last != "" {
		t.Errorf("pages %v %q, %v %q, want newest first", got(p1), next, got(p2), last)
	}
	f.page("key-a", "/v2/sandboxes?order=asc&limit=1", &p1)
	if fmt.Sprint(got(p1)) != fmt.Sprint([]string{ids[0]}) {
		t.Errorf("asc: %v", got(p1))
	}
	f.page("key-a", "/v2/sandboxes?startedAfter=2026-12-05T12:00:01Z", &p1)
	if len(p1) != 2 {
		t.Errorf("startedAfter: %v", got(p1))
	}
	f.page("key-a", "/v2/sandboxes?template=other", &p1)
	if len(p1) != 0 {
		t.Errorf("template filter: %v", got(p1))
	}
	var e apiError
	for _, q := range []string{"limit=0", "limit=x", "order=up", "startedAfter=today"} {
		if code := f.do("key-a", "GET", "/v2/sandboxes?"+q, "", &e); code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, code)
		}
	}
}
