package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/cors"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/internal/envdweb"
)

const (
	// The SDK names the sandbox and the port in these headers on every
	// request to E2B_SANDBOX_URL.
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"

	annAutoResume = "e2b.cryo.dev/auto-resume"
)

// Gateway is what E2B_SANDBOX_URL points at: it routes each request by its
// E2b-Sandbox-Id header (or, for E2B_DOMAIN's <port>-<id>.<domain> hosts,
// by its Host) to envd at <podIP>:EnvdPort of the sandbox's running pod, in
// whatever namespace it is (the one namespace holding the id: see find).
// It takes no API key: the SDK sends none to envd, whose access token
// guards every call. A paused sandbox created with autoResume is resumed
// by its first request, which waits for it.
//
// Refusals are E2B's proxy's: 502 with {"sandboxId","message","code"},
// which the SDK maps to "not running" (isRunning() false, a TimeoutError
// or SandboxNotFoundError on calls).
type Gateway struct {
	Server *Server
	// Cache is where sandboxes are looked up (required): an informer
	// cache holding the sandbox pods (the API labels them
	// controller.LabelRuntimeClass, which the controller's cache
	// selects) and the Checkpoints, indexed by IndexSandboxes. The API
	// server, through Server.Client, is read only for a sandbox that
	// Cache shows paused (find), and to resume one.
	Cache client.Reader
	// Port is envd's port in the pod; 0 means EnvdPort (tests point it
	// elsewhere).
	Port int
	// ReadyWait bounds how long a request waits for a starting, pausing
	// or resuming sandbox to take traffic; 0 means 3 minutes.
	ReadyWait time.Duration
	// Transport reaches the pods; nil means one with a dial timeout.
	Transport http.RoundTripper
	// MaxWaiting bounds the requests that wait at once for one sandbox
	// to take traffic; 0 means 64. The gateway takes no key, and each
	// waiting request holds a connection for up to ReadyWait: past the
	// bound a request is refused at once (429), and what waits for one
	// sandbox cannot grow with what a client sends.
	MaxWaiting int
	// MaxInFlight bounds the requests that the sandboxes of one namespace
	// (one tenant: an API key's) have in the gateway at once, waiting for
	// a sandbox (its connection held up to ReadyWait) or proxied (two
	// connections and their buffers for as long as envd answers: a
	// process's output stream, a watch, a file transfer); 0 means 1024.
	// Past it the tenant's next request is refused at once (429), and the
	// other tenants' go on: no one tenant holds the gateway's connections
	// and memory.
	MaxInFlight int

	resumes singleflight.Group
	reads   singleflight.Group // paused's

	mu       sync.Mutex
	waiting  map[string]int // requests waiting, by sandbox id
	inFlight map[string]int // requests waiting or proxied, by namespace
}

// gatewayError is E2B's proxy's refusal body.
type gatewayError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

func (e *gatewayError) Error() string { return e.Message }

func refuse(code int, id, format string, args ...any) *gatewayError {
	return &gatewayError{SandboxID: id, Message: fmt.Sprintf(format, args...), Code: code}
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		preflight.ServeHTTP(w, r)
		return
	}
	if err := g.Server.unguarded(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, refuse(http.StatusServiceUnavailable, r.Header.Get(headerSandboxID), "%v", err))
		return
	}
	id, err := g.target(r)
	if err == nil {
		if err = g.forward(w, r, id); err == nil {
			return
		}
	}
	var ge *gatewayError
	if !errors.As(err, &ge) {
		g.Server.Log.Error(err, "e2b gateway", "sandbox", id, "path", r.URL.Path)
		ge = refuse(http.StatusBadGateway, id, "sandbox %s: %v", id, err)
	}
	writeJSON(w, ge.Code, ge)
}

// preflight answers a browser's CORS preflight as envd does (any origin,
// method and header), without routing it: a preflight names no header's
// value, so one whose sandbox only E2b-Sandbox-Id names could not be
// routed, and it carries no token. The request that follows is proxied,
// and envd's answer carries the CORS headers.
var preflight = cors.New(envdweb.CORS()).Handler(http.NotFoundHandler())

// forward proxies r to sandbox id's envd, counted against its namespace's
// MaxInFlight from when route finds the sandbox until envd has answered;
// an error when it cannot, nothing written.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, id string) error {
	addr, ns, err := g.route(r.Context(), id)
	if err != nil {
		return err
	}
	defer g.leave(&g.inFlight, ns)
	g.proxy(id, addr).ServeHTTP(w, r)
	return nil
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

func (g *Gateway) port() int {
	if g.Port != 0 {
		return g.Port
	}
	return EnvdPort
}

// target is the sandbox id a request is for: the SDK's header, else the
// first label of a <port>-<id>.<domain> Host. Only envd's port is served:
// other ports of a sandbox (Sandbox.getHost) would expose whatever the
// sandbox listens on to anyone who can reach the gateway, with no token.
func (g *Gateway) target(r *http.Request) (string, error) {
	id, port := r.Header.Get(headerSandboxID), r.Header.Get(headerSandboxPort)
	if id == "" {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		label, _, _ := strings.Cut(host, ".")
		if p, rest, ok := strings.Cut(label, "-"); ok {
			if _, err := strconv.Atoi(p); err == nil {
				port, id = p, rest
			}
		}
	}
	if id == "" {
		return "", refuse(http.StatusBadRequest, "", "header %s: required (the sandbox to reach)", headerSandboxID)
	}
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
		return "", refuse(http.StatusBadRequest, "", "header %s: %q is no sandbox id: %s", headerSandboxID, id, strings.Join(errs, "; "))
	}
	if port != "" && port != strconv.Itoa(EnvdPort) {
		return "", refuse(http.StatusBadGateway, id, "port %s of sandbox %s is not served: cryo's gateway reaches envd (%d) only", port, id, EnvdPort)
	}
	return id, nil
}

func (g *Gateway) readyWait() time.Duration {
	if g.ReadyWait > 0 {
		return g.ReadyWait
	}
	return 3 * time.Minute
}

// route answers the address of the sandbox's envd and the sandbox's
// namespace, resuming the sandbox and waiting for its pod when it has to.
// Once it has found the sandbox, the request counts against the
// namespace's MaxInFlight, waiting as much as proxied: on success the
// caller leaves that count, on an error route has.
func (g *Gateway) route(ctx context.Context, id string) (addr, ns string, err error) {
	ctx, cancel := context.WithTimeout(ctx, g.readyWait())
	defer cancel()
	held := "" // the namespace whose count this request is in
	defer func() {
		if err != nil && held != "" {
			g.leave(&g.inFlight, held)
		}
	}()
	waited := false
	for {
		ip, sb, err := g.find(ctx, id)
		if err != nil {
			return "", "", err
		}
		if sb != nil && held == "" {
			if !g.enter(&g.inFlight, sb.ns, g.maxInFlight()) {
				return "", "", refuse(http.StatusTooManyRequests, id, "sandbox %s: its team has %d requests in flight through the gateway, the most it may", id, g.maxInFlight())
			}
			held = sb.ns
		}
		switch {
		case ip != "" && !waited:
			return g.addr(ip), sb.ns, nil
		case ip != "":
			// A pod that has just started: its envd may not listen yet.
			if g.listening(ctx, g.addr(ip)) {
				return g.addr(ip), sb.ns, nil
			}
		case sb == nil:
			return "", "", refuse(http.StatusBadGateway, id, "The sandbox was not found")
		case sb.pod == nil && sb.annotations()[annAutoResume] != "true":
			return "", "", refuse(http.StatusBadGateway, id, "sandbox %s is paused and was not created with autoResume: resume it with Sandbox.connect", id)
		case sb.pod == nil:
			if err := g.resume(ctx, sb); err != nil {
				return "", "", err
			}
		case pausing(sb) && sb.pod.Annotations[annAutoResume] != "true":
			return "", "", refuse(http.StatusBadGateway, id, "sandbox %s is being paused", id)
		}
		// Starting, pausing (to be resumed next) or resuming: wait.
		if !waited {
			if !g.enter(&g.waiting, id, g.maxWaiting()) {
				return "", "", refuse(http.StatusTooManyRequests, id, "sandbox %s: %d requests already wait for it to take traffic", id, g.maxWaiting())
			}
			defer g.leave(&g.waiting, id)
		}
		waited = true
		select {
		case <-ctx.Done():
			return "", "", refuse(http.StatusBadGateway, id, "sandbox %s did not take traffic within %s", id, g.readyWait())
		case <-time.After(g.Server.poll()):
		}
	}
}

func (g *Gateway) addr(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(g.port())) }

func (g *Gateway) maxWaiting() int {
	if g.MaxWaiting > 0 {
		return g.MaxWaiting
	}
	return 64
}

func (g *Gateway) maxInFlight() int {
	if g.MaxInFlight > 0 {
		return g.MaxInFlight
	}
	return 1024
}

// enter counts one more request under key in counts (waiting, inFlight),
// false when max already are.
func (g *Gateway) enter(counts *map[string]int, key string, max int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if (*counts)[key] >= max {
		return false
	}
	if *counts == nil {
		*counts = map[string]int{}
	}
	(*counts)[key]++
	return true
}

// leave counts one request under key in counts no more.
func (g *Gateway) leave(counts *map[string]int, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if (*counts)[key]--; (*counts)[key] <= 0 {
		delete(*counts, key)
	}
}

// find looks the sandbox up in every namespace, in Cache. ip is the
// address of its running pod, and sb what its namespace holds of it; or,
// without ip, sb to wait for, resume or refuse (starting, being paused,
// paused), nil when it is unknown. An id that Cache does not hold costs
// the API server nothing, whoever sends it and however often; nor does a
// sandbox that runs, starts or is being paused. Only a sandbox that Cache
// shows paused is read from the API server, one object by name (see
// paused).
//
// Labels are whatever an object's creator wrote. LabelGuard keeps
// LabelSandbox to the controller, and find does not rely on that alone:
// a sandbox lives in one namespace, its API key's, so an id on objects of
// two namespaces means that someone else labelled one of them (before the
// guard was applied, or past it). Nothing tells which one is the sandbox:
// find routes to neither. And it routes only to a pod named and classed as
// the API makes them, so that a label added to someone's existing pod
// never makes it the sandbox's.
//
// Cache keeps nothing of its own: each request reads the informer's
// current state, so a pod deleted or replaced stops being served once its
// event arrives (the informer's lag behind the API server), and nothing
// here lengthens that. Its address can be reused only after the kubelet
// has seen the same deletion and torn the pod down.
func (g *Gateway) find(ctx context.Context, id string) (ip string, sb *sandbox, err error) {
	if g.Cache == nil {
		return "", nil, errors.New("the gateway has no cache to find sandboxes in")
	}
	pods, cps, err := sandboxObjects(ctx, g.Cache, client.MatchingFields{IndexSandbox: id})
	if err != nil {
		return "", nil, fmt.Errorf("cache: %w", err)
	}
	nss := namespaces(pods, cps)
	switch {
	case len(nss) == 0:
		return "", nil, nil
	case len(nss) > 1:
		g.Server.Log.Error(errors.New("sandbox id on objects of more than one namespace"),
			"e2b gateway: refused; delete the pods and Checkpoints that cryo's E2B API did not make (docs/e2b.md#the-label-guard)",
			"sandbox", id, "namespaces", nss)
		return "", nil, refuse(http.StatusBadGateway, id, "sandbox %s: its id is on objects of more than one namespace, so it is not served until an administrator removes the foreign ones", id)
	}
	sb, found := assemble(nss[0], id, pods, cps)
	switch {
	case sb.pod != nil:
		return g.at(ctx, sb, sb.pod)
	case pausingSandbox(sb):
		return "", sb, nil // the pod gone or going, the snapshot not yet safe: wait
	case !found && resumedGone(sb) == "":
		return "", nil, nil // ended (endedPod), or only failed pauses
	}
	// Paused, or resumed and gone as Cache has it: paused reads which.
	return g.paused(ctx, sb)
}

// at is the address of pod p, the newest live one of sb, if it takes
// traffic, with sb; otherwise sb alone, to wait for (starting, or being
// checkpointed away: a Checkpoint of its name, read from Cache).
func (g *Gateway) at(ctx context.Context, sb *sandbox, p *corev1.Pod) (string, *sandbox, error) {
	if p.Labels[LabelSandbox] != sb.id || !g.Server.sandboxPod(p, sb.id) {
		return "", nil, refuse(http.StatusBadGateway, sb.id, "sandbox %s: pod %s is not one cryo's E2B API made (its name or RuntimeClass differ)", sb.id, p.Name)
	}
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return "", sb, nil
	}
	var cp cryov1.Checkpoint
	switch err := g.Cache.Get(ctx, client.ObjectKeyFromObject(p), &cp); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", nil, fmt.Errorf("cached Checkpoint %s: %w", p.Name, err)
	case checkpointsAway(&cp, p):
		return "", sb, nil
	}
	return p.Status.PodIP, sb, nil
}

// paused is a sandbox that Cache shows paused, as the API server has it
// now. The gateway acts on that answer (it resumes the sandbox, or
// refuses it as paused), so the cache's lag must not decide it: a
// Sandbox.connect that resumed it, on this replica or another, returns
// to the SDK, which calls the gateway next, possibly before the new pod's
// event has reached this cache. A resume, whoever makes it, creates the
// pod of the newest Checkpoint's next generation, so one read by name in
// the namespace Cache holds the id in tells. That read also finds a
// resumed pod that Cache never holds (its owner removed
// controller.LabelRuntimeClass before the label guard refused it), and
// one that has ended since: then the sandbox is gone. Concurrent requests share it.
//
// A sandbox that Cache shows resumed as that pod (resumedGone: its mark
// without the pod) is read the same way: the pod there, the cache had not
// seen it yet; gone or going, the sandbox went with it, unless a pause of
// it, which Cache may not show either, made the Checkpoint of its name:
// that is read too, in this case only (settle's reads).
func (g *Gateway) paused(ctx context.Context, sb *sandbox) (string, *sandbox, error) {
	key := client.ObjectKey{Namespace: sb.ns, Name: podName(sb.id, generation(sb.last.Annotations)+1)}
	marked := resumedGone(sb) == key.Name
	type objects struct {
		pod *corev1.Pod
		cp  *cryov1.Checkpoint
	}
	v, err, _ := g.reads.Do(fmt.Sprintf("%s/%t", key, marked), func() (any, error) {
		// Not the first request's context: its end must not fail the
		// others sharing the read.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		p, cp, err := g.Server.resumedObjects(ctx, key, marked)
		return objects{p, cp}, err
	})
	if err != nil {
		return "", nil, err
	}
	p := v.(objects).pod
	switch {
	case (p == nil || p.DeletionTimestamp != nil) && marked && v.(objects).cp == nil:
		// Resumed as p, and p deleted outside a pause: gone.
		return "", nil, nil
	case p == nil || p.DeletionTimestamp != nil:
		return "", sb, nil
	case podEnded(p):
		// Resumed, then its VM or its container died: the sandbox has
		// ended (endedPod), and is resumed no more.
		return "", nil, nil
	}
	p = p.DeepCopy() // shared with the other requests
	cur := *sb
	cur.pod, cur.pods = p, append(slices.Clone(sb.pods), *p)
	return g.at(ctx, &cur, p)
}

// sandboxPod: p has the name and the RuntimeClass that the API gives the
// pods of sandbox id. A name is fixed at creation, before anyone but the
// API knows the id.
func (s *Server) sandboxPod(p *corev1.Pod, id string) bool {
	return p.Name == podName(id, generation(p.Annotations)) &&
		p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName == s.RuntimeClass
}

// namespaces are those of the objects, sorted, once each.
func namespaces(pods []corev1.Pod, cps []cryov1.Checkpoint) []string {
	set := map[string]bool{}
	for i := range pods {
		set[pods[i].Namespace] = true
	}
	for i := range cps {
		set[cps[i].Namespace] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// IndexSandbox is the field index of pods and Checkpoints by their
// LabelSandbox that Gateway.Cache needs.
const IndexSandbox = "e2b.sandbox"

// IndexSandboxes adds IndexSandbox to a cache's pods and Checkpoints, so
// that the gateway finds a sandbox's objects without scanning every one
// the cache holds.
func IndexSandboxes(ctx context.Context, fi client.FieldIndexer) error {
	if err := fi.IndexField(ctx, &corev1.Pod{}, IndexSandbox, sandboxOf); err != nil {
		return err
	}
	return fi.IndexField(ctx, &cryov1.Checkpoint{}, IndexSandbox, sandboxOf)
}

func sandboxOf(o client.Object) []string {
	if id := o.GetLabels()[LabelSandbox]; id != "" {
		return []string{id}
	}
	return nil
}

func checkpointsAway(cp *cryov1.Checkpoint, p *corev1.Pod) bool {
	return cp.Name == p.Name && cp.Spec.KeepRunning != nil && !*cp.Spec.KeepRunning && cp.Status.Phase != cryov1.PhaseFailed
}

// pausing is a sandbox whose live pod is being checkpointed away.
func pausing(sb *sandbox) bool {
	return sb.pod != nil && sb.last != nil && checkpointsAway(sb.last, sb.pod)
}

// pausingSandbox: lookup finds no sandbox between a pause's Checkpoint
// being created and its Succeeded, once the pod is gone or going; the
// gateway waits for it rather than answering "not found".
func pausingSandbox(sb *sandbox) bool {
	return sb != nil && sb.last != nil && sb.last.Status.Phase != cryov1.PhaseSucceeded && sb.last.Status.Phase != cryov1.PhaseFailed
}

// resume starts the paused sandbox's next pod once, however many requests
// ask at the same time. Across replicas the next pod's name is the same
// for all, so the losers' create fails with AlreadyExists: resumed too.
// The resumed sandbox gets the default timeout, as a connect without one.
func (g *Gateway) resume(ctx context.Context, sb *sandbox) error {
	ns := sb.last.Namespace
	_, err, _ := g.resumes.Do(ns+"/"+sb.id, func() (any, error) {
		// Not the first request's context: its cancellation must not fail
		// the others waiting on the same resume. As long as a request
		// waits for it: a restore the other tenants slow may take more
		// than a minute, and one cut short is deleted and fails them all.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.readyWait())
		defer cancel()
		cur, found, err := g.Server.lookup(ctx, ns, sb.id)
		switch {
		case err != nil:
			return nil, err
		case !found && !pausingSandbox(cur):
			// Killed, or ended, since the cache's view.
			return nil, refuse(http.StatusBadGateway, sb.id, "The sandbox was not found")
		case !found || cur.pod != nil:
			return nil, nil // being paused again, or already resumed
		}
		token, err := g.Server.token(ctx, ns, tokenSecretName(sb.id))
		if err != nil {
			return nil, err
		}
		err = g.Server.resume(ctx, cur, defaultTimeout, token)
		if apierrors.IsAlreadyExists(err) {
			return nil, nil
		}
		if err == nil {
			g.Server.Log.Info("sandbox auto-resumed", "namespace", ns, "sandbox", sb.id)
		}
		return nil, err
	})
	return err
}

// listening reports whether envd accepts connections at addr.
func (g *Gateway) listening(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// proxy forwards to envd at addr. Streams (process output, watches) are
// flushed as they come: FlushInterval -1.
func (g *Gateway) proxy(id, addr string) *httputil.ReverseProxy {
	target := &url.URL{Scheme: "http", Host: addr}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = addr
		},
		Transport:     g.transport(),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			g.Server.Log.Info("e2b gateway: envd unreachable", "sandbox", id, "address", addr, "error", err.Error())
			writeJSON(w, http.StatusBadGateway, refuse(http.StatusBadGateway, id, "sandbox %s is not reachable: %v", id, err))
		},
	}
}

func (g *Gateway) transport() http.RoundTripper {
	if g.Transport != nil {
		return g.Transport
	}
	return defaultTransport
}

// defaultTransport: no response-header or overall timeout, since a
// process's output stream lasts as long as the process.
var defaultTransport = &http.Transport{
	DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	MaxIdleConnsPerHost: 16,
	IdleConnTimeout:     90 * time.Second,
}

// GatewayListener serves a Gateway on Addr on every replica: like the
// API, it keeps no state but the in-flight resumes.
type GatewayListener struct {
	Gateway *Gateway
	Addr    string
}

func (l *GatewayListener) NeedLeaderElection() bool { return false }

func (l *GatewayListener) Start(ctx context.Context) error {
	// No write timeout: a process's output stream lasts as long as it.
	srv := &http.Server{Handler: l.Gateway, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", l.Addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	l.Gateway.Server.Log.Info("e2b sandbox gateway serving", "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
