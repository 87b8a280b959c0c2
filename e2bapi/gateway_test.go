package e2bapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

// envdStub plays envd: it echoes what reached it, and streams on /stream
// (a first line, then a second once release is closed).
type envdStub struct {
	release chan struct{}
	port    int
}

func newEnvdStub(t *testing.T) *envdStub {
	e := &envdStub{release: make(chan struct{})}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			_, _ = io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-e.release
			_, _ = io.WriteString(w, "second\n")
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Envd", "stub")
		_, _ = io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" token="+r.Header.Get("X-Access-Token")+" body="+string(body))
	}))
	t.Cleanup(func() {
		select {
		case <-e.release:
		default:
			close(e.release)
		}
		ts.Close()
	})
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	e.port, _ = strconv.Atoi(port)
	return e
}

// countingClient counts the pods created through it (the resumes) and
// the reads. Each create takes a while, as on an API server, so that
// concurrent requests that all saw the sandbox paused would all try.
type countingClient struct {
	client.Client
	pods  atomic.Int32
	reads atomic.Int32
}

func (c *countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *countingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.reads.Add(1)
	return c.Client.List(ctx, list, opts...)
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*corev1.Pod); ok {
		c.pods.Add(1)
		time.Sleep(20 * time.Millisecond)
	}
	return c.Client.Create(ctx, obj, opts...)
}

type gatewayFixture struct {
	*fixture
	gw     *Gateway
	cc     *countingClient
	url    string
	envd   *envdStub
	client *http.Client
}

func newGatewayFixture(t *testing.T) *gatewayFixture {
	f := newFixture(t)
	e := newEnvdStub(t)
	cc := &countingClient{Client: f.cl}
	srv := *f.srv
	srv.Client = cc
	// The cache is the fixture's store itself: never stale, and its
	// reads are not counted as the API server's.
	gw := &Gateway{Server: &srv, Cache: f.cl, Port: e.port, ReadyWait: 5 * time.Second}
	ts := httptest.NewServer(gw)
	t.Cleanup(ts.Close)
	return &gatewayFixture{fixture: f, gw: gw, cc: cc, url: ts.URL, envd: e, client: ts.Client()}
}

// running plays the kubelet: pod ns/name runs at 127.0.0.1, where the stub
// envd listens.
func (f *gatewayFixture) running(ns, name string) {
	f.t.Helper()
	p := f.pod(ns, name)
	p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "127.0.0.1"
	if err := f.cl.Status().Update(context.Background(), p); err != nil {
		f.t.Fatal(err)
	}
}

// runningOnceCreated plays the kubelet for a pod that does not exist yet.
func (f *gatewayFixture) runningOnceCreated(ns, name string) {
	go func() {
		ctx := context.Background()
		for i := 0; i < 5000; i++ {
			var p corev1.Pod
			if err := f.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err == nil {
				p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "127.0.0.1"
				if f.cl.Status().Update(ctx, &p) == nil {
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
}

// send is the SDK's request to E2B_SANDBOX_URL for sandbox id ("" sends
// no header).
func (f *gatewayFixture) send(id, method, path, body string, header map[string]string) (int, http.Header, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// refusal decodes E2B's proxy error body, failing unless it is one.
func (f *gatewayFixture) refusal(code int, body string, wantCode int, wantID, wantMsg string) {
	f.t.Helper()
	var e gatewayError
	if err := json.Unmarshal([]byte(body), &e); err != nil || code != wantCode || e.Code != wantCode || e.SandboxID != wantID || !strings.Contains(e.Message, wantMsg) {
		f.t.Errorf("answer %d %s, want %d {sandboxId %q, message with %q} (err %v)", code, body, wantCode, wantID, wantMsg, err)
	}
}

func TestGatewayProxies(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base"}`)
	other := f.create("key-b", `{"templateID":"base"}`)
	f.running("team-a", podName(id, 0))
	f.running("team-b", podName(other, 0))

	code, hdr, body := f.send(id, "POST", "/process.Process/Start?x=1", "payload", map[string]string{"X-Access-Token": "tok"})
	if code != 200 || hdr.Get("X-Envd") != "stub" || body != "POST /process.Process/Start?x=1 token=tok body=payload" {
		t.Errorf("proxied request: %d %q", code, body)
	}
	// Any namespace: the id is the route, envd's token the lock.
	if code, _, body := f.send(other, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("another namespace's sandbox: %d %q", code, body)
	}
	// E2B_DOMAIN's hosts, <port>-<id>.<domain>, without the header.
	if code, _, body := f.send("", "GET", "/files?path=/a", "", map[string]string{"Host": "49983-" + id + ".sandbox.example"}); code != 200 || !strings.HasPrefix(body, "GET /files?path=/a") {
		t.Errorf("routed by host: %d %q", code, body)
	}

	// A stream reaches the client as it comes, not when it ends.
	req, _ := http.NewRequest("GET", f.url+"/stream", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Errorf("first line of a stream: %q %v, want it before the stream ends", line, err)
	}
	close(f.envd.release)

	code, _, body = f.send("", "GET", "/health", "", map[string]string{"Host": "cryo-e2b-sandbox.cryo-system.svc"})
	f.refusal(code, body, 400, "", "E2b-Sandbox-Id")
	code, _, body = f.send("Not_A/Label", "GET", "/health", "", nil)
	f.refusal(code, body, 400, "", "E2b-Sandbox-Id")
	code, _, body = f.send(id, "GET", "/", "", map[string]string{"E2b-Sandbox-Port": "22"})
	f.refusal(code, body, 502, id, "port 22")
	code, _, body = f.send("nosuchsandbox", "GET", "/health", "", nil)
	f.refusal(code, body, 502, "nosuchsandbox", "The sandbox was not found")
}

// A running pod whose envd does not answer: E2B's 502, naming the sandbox.
func TestGatewayEnvdUnreachable(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base"}`)
	f.running("team-a", podName(id, 0))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.gw.Port = l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "not reachable")
}

// A sandbox whose pod is not running yet (just created) is waited for.
func TestGatewayWaitsForStart(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base"}`)
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.runningOnceCreated("team-a", podName(id, 0))
	}()
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("request to a starting sandbox: %d %q", code, body)
	}
}

// TestGatewayWaitingBounded: no more than MaxWaiting requests wait at
// once for one sandbox to take traffic; the next is refused at once (429),
// and another sandbox's requests still wait. Once the sandbox runs, those
// that waited reach it, and nothing is counted as waiting any more.
func TestGatewayWaitingBounded(t *testing.T) {
	f := newGatewayFixture(t)
	f.gw.MaxWaiting = 2
	id := f.create("key-a", `{"templateID":"base"}`)
	other := f.create("key-a", `{"templateID":"base"}`)
	for _, id := range []string{id, other} { // as if restarting
		p := f.pod("team-a", podName(id, 0))
		p.Status.Phase, p.Status.PodIP = corev1.PodPending, ""
		if err := f.cl.Status().Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	get := func(id string) <-chan int {
		code := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", f.url+"/health", nil)
			req.Header.Set("E2b-Sandbox-Id", id)
			resp, err := f.client.Do(req)
			if err != nil {
				code <- 0
				return
			}
			resp.Body.Close()
			code <- resp.StatusCode
		}()
		return code
	}
	waits := []<-chan int{get(id), get(id)}
	deadline := time.Now().Add(5 * time.Second)
	for f.waitingFor(id) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.waitingFor(id); n != 2 {
		t.Fatalf("%d requests wait for the starting sandbox, want 2", n)
	}
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, http.StatusTooManyRequests, id, "2 requests already wait")
	waits = append(waits, get(other))
	f.running("team-a", podName(id, 0))
	f.running("team-a", podName(other, 0))
	for i, w := range waits {
		if c := <-w; c != http.StatusOK {
			t.Errorf("waiting request %d: %d, want 200 once the sandbox runs", i, c)
		}
	}
	if n := f.waitingFor(id) + f.waitingFor(other); n != 0 {
		t.Errorf("%d requests still counted as waiting", n)
	}
}

// TestGatewayInFlightBounded: the sandboxes of one namespace have at most
// MaxInFlight requests proxied at once, whichever sandbox they are for;
// the next is refused at once (429), another namespace's go on, and once
// the streams end nothing is counted.
func TestGatewayInFlightBounded(t *testing.T) {
	f := newGatewayFixture(t)
	f.gw.MaxInFlight = 2
	a1, a2 := f.create("key-a", `{"templateID":"base"}`), f.create("key-a", `{"templateID":"base"}`)
	b := f.create("key-b", `{"templateID":"base"}`)
	f.running("team-a", podName(a1, 0))
	f.running("team-a", podName(a2, 0))
	f.running("team-b", podName(b, 0))
	stream := func(id string) *http.Response {
		req, _ := http.NewRequest("GET", f.url+"/stream", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); resp.StatusCode != 200 || line != "first\n" {
			t.Fatalf("stream of %s: %d %q %v", id, resp.StatusCode, line, err)
		}
		return resp
	}
	streams := []*http.Response{stream(a1), stream(a2)}
	code, _, body := f.send(a1, "GET", "/health", "", nil)
	f.refusal(code, body, http.StatusTooManyRequests, a1, "2 requests in flight")
	if code, _, body := f.send(b, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("another namespace's request while team-a is at its bound: %d %q", code, body)
	}
	close(f.envd.release)
	for _, r := range streams {
		_, _ = io.ReadAll(r.Body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.inFlight("team-a")+f.inFlight("team-b") != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.inFlight("team-a") + f.inFlight("team-b"); n != 0 {
		t.Errorf("%d requests still counted in flight after the streams ended", n)
	}
	if code, _, body := f.send(a1, "GET", "/health", "", nil); code != 200 {
		t.Errorf("request once team-a's streams ended: %d %q", code, body)
	}
}

// TestGatewayWaitingInFlight: requests waiting for a starting sandbox
// count against its namespace's MaxInFlight as proxied ones do, so what
// one team's requests hold, waiting or streaming, is bounded in all.
func TestGatewayWaitingInFlight(t *testing.T) {
	f := newGatewayFixture(t)
	f.gw.MaxInFlight = 2
	starting, running := f.create("key-a", `{"templateID":"base"}`), f.create("key-a", `{"templateID":"base"}`)
	b := f.create("key-b", `{"templateID":"base"}`)
	p := f.pod("team-a", podName(starting, 0))
	p.Status.Phase, p.Status.PodIP = corev1.PodPending, ""
	if err := f.cl.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.running("team-a", podName(running, 0))
	f.running("team-b", podName(b, 0))
	var waits []<-chan int
	for range 2 {
		code := make(chan int, 1)
		go func() {
			c, _, _ := f.send(starting, "GET", "/health", "", nil)
			code <- c
		}()
		waits = append(waits, code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.inFlight("team-a") < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.inFlight("team-a"); n != 2 {
		t.Fatalf("%d requests of team-a counted in flight while 2 wait, want 2", n)
	}
	code, _, body := f.send(running, "GET", "/health", "", nil)
	f.refusal(code, body, http.StatusTooManyRequests, running, "2 requests in flight")
	if code, _, body := f.send(b, "GET", "/health", "", nil); code != 200 {
		t.Errorf("another namespace's request: %d %q", code, body)
	}
	f.running("team-a", podName(starting, 0))
	for i, w := range waits {
		if c := <-w; c != http.StatusOK {
			t.Errorf("waiting request %d: %d, want 200 once the sandbox runs", i, c)
		}
	}
	// A handler leaves its count after the client has its answer: wait.
	deadline = time.Now().Add(5 * time.Second)
	for f.inFlight("team-a")+f.inFlight("team-b") != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := f.inFlight("team-a") + f.inFlight("team-b"); n != 0 {
		t.Errorf("%d requests still counted in flight", n)
	}
}

func (f *gatewayFixture) inFlight(ns string) int {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	return f.gw.inFlight[ns]
}

func (f *gatewayFixture) waitingFor(id string) int {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	return f.gw.waiting[id]
}

func TestGatewayPausedWithoutAutoResume(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base","autoPause":true}`)
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "paused")
	if n := f.cc.pods.Load(); n != 0 {
		t.Errorf("the gateway created %d pods for a sandbox without autoResume", n)
	}
}

// TestGatewayAutoResume: requests to an autoResume sandbox while it is
// being paused wait for the pause, resume it once however many they are,
// and reach the resumed pod; a later pause and request resume it again.
func TestGatewayAutoResume(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`)
	if a := f.pod("team-a", podName(id, 0)).Annotations[annAutoResume]; a != "true" {
		t.Fatalf("pod annotation %s = %q, want true", annAutoResume, a)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.Lifecycle == nil || !d.Lifecycle.AutoResume || d.Lifecycle.OnTimeout != "pause" {
		t.Fatalf("getInfo: %d %+v", code, d.Lifecycle)
	}
	f.running("team-a", podName(id, 0))

	// A pause under way: the Checkpoint exists, not yet Succeeded.
	paused := make(chan int, 1)
	go func() { paused <- f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil) }()
	if !waitFor(func() bool {
		var cp cryov1.Checkpoint
		return f.cl.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: podName(id, 0)}, &cp) == nil
	}) {
		t.Fatal("no Checkpoint for the pause")
	}
	f.runningOnceCreated("team-a", podName(id, 1))
	var wg sync.WaitGroup
	answers := make([]string, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, body := f.send(id, "GET", "/health", "", nil)
			answers[i] = strconv.Itoa(code) + " " + body
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if n := f.cc.pods.Load(); n != 0 {
		t.Errorf("resumed (%d pods) before the pause finished", n)
	}
	f.controllerPauses("team-a", podName(id, 0))
	wg.Wait()
	if code := <-paused; code != http.StatusNoContent {
		t.Errorf("pause: %d", code)
	}
	for i, a := range answers {
		if !strings.HasPrefix(a, "200 GET /health") {
			t.Errorf("request %d during the pause: %q, want it proxied once resumed", i, a)
		}
	}
	if n := f.cc.pods.Load(); n != 1 {
		t.Errorf("%d concurrent first requests created %d pods, want 1", len(answers), n)
	}
	p := f.pod("team-a", podName(id, 1))
	noShimAnnotations(t, p)
	if p.Annotations[controller.AnnotationRestoreCheckpoint] != podName(id, 0) || p.Annotations[annAutoResume] != "true" {
		t.Errorf("auto-resumed pod: %v", p.Annotations)
	}

	// Paused again (now fully), the next request resumes generation 2.
	f.controllerPauses("team-a", podName(id, 1))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("second pause: %d", code)
	}
	f.runningOnceCreated("team-a", podName(id, 2))
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 {
		t.Errorf("request to the paused sandbox: %d %q", code, body)
	}
	if n := f.cc.pods.Load(); n != 2 {
		t.Errorf("pods created after the second resume: %d, want 2", n)
	}
	// Killed: not found, and no resume.
	if code := f.do("key-a", "DELETE", "/sandboxes/"+id, "", nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "not found")
}

func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// TestGatewayCache: a running sandbox is served from Gateway.Cache with no
// read through the API server's client; a sandbox the cache shows
// starting, pausing or going is left to that client.
func TestGatewayCache(t *testing.T) {
	f := newGatewayFixture(t)
	id := f.create("key-a", `{"templateID":"base"}`)
	f.running("team-a", podName(id, 0))
	f.cc.reads.Store(0)
	for range 10 {
		if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
			t.Fatalf("request to a running sandbox: %d %q", code, body)
		}
	}
	if n := f.cc.reads.Load(); n != 0 {
		t.Errorf("10 requests to a running sandbox read the API server %d times, want 0", n)
	}
	ctx := context.Background()
	cached := func() string {
		t.Helper()
		reads := f.cc.reads.Load()
		ip, _, err := f.gw.find(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if n := f.cc.reads.Load() - reads; n != 0 {
			t.Errorf("find of a sandbox the cache shows live read the API server %d times", n)
		}
		return ip
	}
	if ip := cached(); ip != "127.0.0.1" {
		t.Fatalf("cached address %q", ip)
	}
	if _, _, err := (&Gateway{Server: f.gw.Server}).find(ctx, id); err == nil {
		t.Errorf("a gateway without a cache found the sandbox")
	}

	// Being paused: the Checkpoint of the pod's name, keepRunning false.
	no := false
	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: podName(id, 0)}, Spec: cryov1.CheckpointSpec{PodName: podName(id, 0), KeepRunning: &no}}
	if err := f.cl.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if ip := cached(); ip != "" {
		t.Errorf("a sandbox being paused served from the cache at %q", ip)
	}
	cp.Status.Phase = cryov1.PhaseFailed
	if err := f.cl.Update(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if ip := cached(); ip != "127.0.0.1" {
		t.Errorf("after a failed pause: cached address %q", ip)
	}

	// A newer generation starting (the fixture's kubelet leaves it
	// Pending): the old pod is not the sandbox's.
	p1 := f.pod("team-a", podName(id, 0)).DeepCopy()
	p1.ObjectMeta = metav1.ObjectMeta{Namespace: "team-a", Name: podName(id, 1), Labels: p1.Labels,
		Annotations: map[string]string{annGen: "1", annMetadata: `{"hang":"yes"}`}}
	p1.Status = corev1.PodStatus{}
	if err := f.cl.Create(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool { p1 = f.pod("team-a", podName(id, 1)); return p1.Status.Phase == corev1.PodPending }) {
		t.Fatalf("generation 1: %+v", p1.Status)
	}
	if ip := cached(); ip != "" {
		t.Errorf("generation 0 served at %q while generation 1 starts", ip)
	}
	p1.Status.Phase, p1.Status.PodIP = corev1.PodRunning, "127.0.0.2"
	if err := f.cl.Status().Update(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if ip := cached(); ip != "127.0.0.2" {
		t.Errorf("generation 1 running: cached address %q", ip)
	}

	// Being deleted: a finalizer keeps the object, with its address.
	p1.Finalizers = []string{"test/hold"}
	if err := f.cl.Update(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Delete(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if ip := cached(); ip != "127.0.0.1" {
		t.Errorf("generation 1 being deleted: cached address %q, want generation 0's", ip)
	}
	if err := f.cl.Delete(ctx, f.pod("team-a", podName(id, 0))); err != nil {
		t.Fatal(err)
	}
	if ip := cached(); ip != "" {
		t.Errorf("every pod gone or going: cached address %q", ip)
	}
}

// TestGatewayOneNamespace: a pod or Checkpoint of another namespace
// labelled with a sandbox's id (made before the label guard, or past it)
// gets none of the sandbox's traffic: the id is refused while two
// namespaces hold it, whichever the cache or the API server shows, and
// served again once the foreign object is gone.
func TestGatewayOneNamespace(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()
	id := f.create("key-a", `{"templateID":"base"}`)
	f.running("team-a", podName(id, 0))
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 {
		t.Fatalf("request to the sandbox: %d %q", code, body)
	}
	// Shaped as the API's pods, and of a newer generation: the cache used
	// to route to the newest pod with the label, whatever its namespace.
	foreign := f.srv.pod("team-b", id, 7, Template{Image: "busybox:1"}, nil, map[string]string{annGen: "7"})
	if err := f.cl.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool { return f.pod("team-b", foreign.Name).Status.PodIP != "" }) {
		t.Fatal("the foreign pod does not run")
	}
	if ip, _, err := f.gw.find(ctx, id); ip != "" || err == nil {
		t.Errorf("an id held by two namespaces found at %q (%v)", ip, err)
	}
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "more than one namespace")
	if err := f.cl.Delete(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if code, _, body := f.send(id, "GET", "/health", "", nil); code != 200 || !strings.HasPrefix(body, "GET /health") {
		t.Errorf("once the foreign pod is gone: %d %q", code, body)
	}

	// Paused, with a foreign Checkpoint that asks to be resumed: neither
	// is resumed, nothing is created.
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: podName(id, 3),
		Labels: map[string]string{LabelSandbox: id}, Annotations: map[string]string{annGen: "3", annAutoResume: "true", annTemplate: "base"}},
		Spec: cryov1.CheckpointSpec{PodName: podName(id, 3)}, Status: cryov1.CheckpointStatus{Phase: cryov1.PhaseSucceeded}}
	if err := f.cl.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	created := f.cc.pods.Load()
	code, _, body = f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "more than one namespace")
	if n := f.cc.pods.Load(); n != created {
		t.Errorf("the gateway created %d pods for an id held by two namespaces", n-created)
	}
	if err := f.cl.Delete(ctx, cp); err != nil {
		t.Fatal(err)
	}
	code, _, body = f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "paused")
}

// TestGatewayOnlyAPIPods: a pod is routed to only if it has the name and
// RuntimeClass the API gives a sandbox's pods, so that a label put on a
// pod made for something else does not make it a sandbox.
func TestGatewayOnlyAPIPods(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()
	cryo, runc := "cryo", "runc"
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", Labels: map[string]string{LabelSandbox: "sbxweb"}},
			Spec: corev1.PodSpec{RuntimeClassName: &cryo, Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: podName("sbxrunc", 0), Labels: map[string]string{LabelSandbox: "sbxrunc"}},
			Spec: corev1.PodSpec{RuntimeClassName: &runc, Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}},
	} {
		if err := f.cl.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if !waitFor(func() bool { return f.pod("team-a", p.Name).Status.PodIP != "" }) {
			t.Fatalf("pod %s does not run", p.Name)
		}
		id := p.Labels[LabelSandbox]
		if ip, _, err := f.gw.find(ctx, id); ip != "" || err == nil {
			t.Errorf("pod %s found at %q (%v)", p.Name, ip, err)
		}
		code, _, body := f.send(id, "GET", "/health", "", nil)
		f.refusal(code, body, 502, id, "not one cryo's E2B API made")
	}
}

// TestGatewayPreflight: a browser's CORS preflight names no header's
// value, so the sandbox id of E2b-Sandbox-Id is not in it; the gateway
// answers it as envd would, for any origin, without routing or reading
// anything, and proxies the request that follows.
func TestGatewayPreflight(t *testing.T) {
	f := newGatewayFixture(t)
	before := f.cc.reads.Load()
	code, h, _ := f.send("", "OPTIONS", "/process.Process/Start", "", map[string]string{
		"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "e2b-sandbox-id,e2b-sandbox-port,x-access-token,connect-protocol-version",
	})
	if code >= 300 || h.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "e2b-sandbox-id") {
		t.Errorf("preflight: %d %v, want it allowed for any origin and header", code, h)
	}
	if n := f.cc.reads.Load() - before; n != 0 {
		t.Errorf("a preflight read the API server %d times, want none", n)
	}
	// An OPTIONS that is no preflight is routed as before: no sandbox named.
	code, _, body := f.send("", "OPTIONS", "/process.Process/Start", "", nil)
	f.refusal(code, body, http.StatusBadRequest, "", "")
}
