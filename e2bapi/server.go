// Package e2bapi serves the control-plane REST API of E2B's SDK (npm and
// PyPI `e2b`) over Kubernetes objects: a sandbox is a pod under the cryo
// RuntimeClass, a pause is a Checkpoint with keepRunning false, a connect
// of a paused sandbox is a new pod restoring that Checkpoint under the same
// sandbox id. Every bit of state lives in those objects (labels and
// annotations) and in the API key Secrets: no other database. See
// docs/e2b.md.
package e2bapi

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

const (
	// LabelAPIKey marks a Secret in the controller's namespace as an API
	// key: data "apiKey" is the key, annotation AnnotationKeyNamespace the
	// one namespace it reaches.
	LabelAPIKey            = "cryo.dev/e2b-api-key"
	AnnotationKeyNamespace = "cryo.dev/e2b-namespace"
	SecretKeyField         = "apiKey"

	// LabelSandbox carries the sandbox id on its pods and Checkpoints.
	LabelSandbox = "cryo.dev/e2b-sandbox"

	// The sandbox's E2B fields. Not under cryo.dev/: the shim refuses a
	// pod with an annotation of its own prefix that it does not know.
	e2bAnnotationPrefix = "e2b.cryo.dev/"
	annTemplate         = "e2b.cryo.dev/template"
	annMetadata         = "e2b.cryo.dev/metadata"
	annEnv              = "e2b.cryo.dev/env"
	annStartedAt        = "e2b.cryo.dev/started-at"
	annEndAt            = "e2b.cryo.dev/end-at"
	annAutoPause        = "e2b.cryo.dev/auto-pause"
	annGen              = "e2b.cryo.dev/generation"
	// annFrom names the Checkpoint a sandbox was created from (a snapshot
	// or a fork); it is the templateID the SDK is shown.
	annFrom = "e2b.cryo.dev/from"
	// annResumedAs, on a pause Checkpoint, names the pod a resume
	// restored it as (its next generation), and annResumedEndAt the end
	// time that resume gave it. They outlive that pod: a Checkpoint so
	// marked, newest of its sandbox, whose pod is gone without a pause of
	// it, is a sandbox whose newest state went with its pod (resumedGone).
	// Set once the pod's create succeeded, removed if that resume fails.
	annResumedAs    = "e2b.cryo.dev/resumed-as"
	annResumedEndAt = "e2b.cryo.dev/resumed-end-at"

	// envdVersion is what the SDK is told the sandbox runs (the envd
	// contract): closeStdin and octet-stream uploads, no file metadata.
	envdVersion = "0.5.7"

	defaultTimeout = 300 * time.Second
	maxTimeout     = 24 * time.Hour
)

// Template is what a templateID starts: an image running Command.
type Template struct {
	Image   string
	Command []string
}

// Server is the API. Client reads and writes the cluster without a cache,
// so that no informer on every Secret or pod is started for it: a request
// reads only its key's namespace, and acts on its newest state. The
// Gateway and the Reaper read a cache of cryo's pods and the Checkpoints
// instead, and authenticate a cache of the key Secrets (Keys).
type Server struct {
	Client client.Client
	// Cache is where Sandbox.list reads the sandboxes: the Gateway's,
	// holding the sandbox pods and the Checkpoints. Nil: Client (a list
	// then costs two lists of the API server).
	Cache client.Reader
	// Keys reads the API key Secrets: a cache configured by KeyCache.
	// Nil: Client (each request lists them from the API server).
	Keys         client.Reader
	Namespace    string // the controller's namespace, home of the key Secrets
	RuntimeClass string
	// DefaultStore is the controller's --default-store: each pod's
	// checkpoint target, which a pause needs, is set here as the
	// webhook sets it, since the webhook lets a pod through without one
	// when it does not answer in time (its failurePolicy Ignore).
	DefaultStore string
	Templates    map[string]Template
	PauseWait    time.Duration // how long a pause waits for its Checkpoint
	Log          logr.Logger
	Now          func() time.Time
	NewID        func() string
	PollInterval time.Duration
	ReapInterval time.Duration

	// StartWait bounds how long create and connect wait for a new pod to
	// run (default 5 minutes; the SDK gives up after its request timeout,
	// 60 s unless requestTimeoutMs says otherwise, and the pod goes).
	StartWait time.Duration
	// EnvdPort and HTTPClient reach envd's /init (default EnvdPort and
	// http.DefaultClient): tests put an httptest server there.
	EnvdPort   int
	HTTPClient *http.Client
	// NodeStats reads a node's kubelet stats summary (the JSON of
	// /api/v1/nodes/<node>/proxy/stats/summary); nil: metrics report
	// usage as zero.
	NodeStats func(ctx context.Context, node string) ([]byte, error)
	// Guard, when set, is asked before every request of the API and the
	// gateway: while it finds the label guard missing or wrong, both
	// answer 503 naming what is wrong (unguarded).
	Guard *GuardMonitor
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func errf(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

// Handler is the API's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, h func(ctx context.Context, ns string, r *http.Request) (int, any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, h) })
	}
	// The v1 create and connect are the v2 ones: E2B's API serves both,
	// and SDK versions call one or the other (the npm SDK 2.51 v2, E2B's
	// JS and Python SDK sources of late 2026 v1).
	route("POST /v2/sandboxes", s.create)
	route("POST /sandboxes", s.create)
	route("GET /v2/sandboxes", s.list)
	route("GET /sandboxes/{id}", s.get)
	route("DELETE /sandboxes/{id}", s.kill)
	route("POST /sandboxes/{id}/timeout", s.setTimeout)
	route("POST /sandboxes/{id}/pause", s.pause)
	route("POST /v2/sandboxes/{id}/connect", s.connect)
	route("POST /sandboxes/{id}/connect", s.connect)
	route("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	route("GET /snapshots", s.listSnapshots)
	route("DELETE /templates/{id}", s.deleteSnapshot)
	route("POST /sandboxes/{id}/fork", s.fork)
	route("GET /sandboxes/{id}/metrics", s.metrics)
	route("PUT /sandboxes/{id}/network", func(context.Context, string, *http.Request) (int, any, error) {
		return 0, nil, errf(http.StatusBadRequest, "network: egress rules are not supported by cryo's E2B API (use a NetworkPolicy on the namespace)")
	})
	refuse := func(what string) func(context.Context, string, *http.Request) (int, any, error) {
		return func(_ context.Context, _ string, r *http.Request) (int, any, error) {
			return 0, nil, errf(http.StatusNotFound, "%s are not supported by cryo's E2B API (docs/e2b.md): %s %s", what, r.Method, r.URL.Path)
		}
	}
	// The SDK's Template.build and its tags, aliases and build status
	// calls; a template is an image configured on the controller.
	for _, p := range []string{"/templates", "/templates/", "/v2/templates", "/v2/templates/", "/v3/templates", "/v3/templates/"} {
		route(p, refuse("template builds"))
	}
	for _, p := range []string{"/volumes", "/volumes/"} {
		route(p, refuse("volumes"))
	}
	for _, p := range []string{"/secrets", "/secrets/"} {
		route(p, refuse("secrets"))
	}
	route("/", func(_ context.Context, _ string, r *http.Request) (int, any, error) {
		return 0, nil, errf(http.StatusNotFound, "no route %s %s", r.Method, r.URL.Path)
	})
	return mux
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, h func(ctx context.Context, ns string, r *http.Request) (int, any, error)) {
	ctx := r.Context()
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	}
	code, body := 0, any(nil)
	ns, err := "", s.unguarded()
	if err == nil {
		ns, err = s.authenticate(ctx, r.Header.Get("X-API-Key"))
	}
	if err == nil {
		code, body, err = h(ctx, ns, r)
	}
	if err != nil {
		var he *httpError
		if !errors.As(err, &he) {
			s.Log.Error(err, "e2b api", "method", r.Method, "path", r.URL.Path)
			he = &httpError{code: http.StatusInternalServerError, msg: err.Error()}
		}
		code, body = he.code, apiError{Code: he.code, Message: he.msg}
	}
	if body == nil {
		w.WriteHeader(code)
		return
	}
	if p, ok := body.(paged); ok {
		if p.next != "" {
			w.Header().Set("X-Next-Token", p.next)
		}
		body = p.items
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// createBody is the SDK's NewSandbox.
type createBody struct {
	TemplateID      string            `json:"templateID"`
	Timeout         *int64            `json:"timeout"`
	Metadata        map[string]string `json:"metadata"`
	EnvVars         map[string]string `json:"envVars"`
	AutoPause       *bool             `json:"autoPause"`
	AutoPauseMemory *bool             `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
	MCP                 json.RawMessage   `json:"mcp"`
	Network             json.RawMessage   `json:"network"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	IAM                 json.RawMessage   `json:"iam"`
	// Secure is E2B's v1 switch; every cryo sandbox's envd needs its
	// token, as on E2B's /v2/sandboxes, so false is ignored (docs/e2b.md).
	Secure *bool `json:"secure"`
}

// sandboxBody is the SDK's Sandbox (create and connect answers).
type sandboxBody struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken *string `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
}

// listedBody is the SDK's ListedSandbox and SandboxDetail.
type listedBody struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	Lifecycle   *lifecycleBody    `json:"lifecycle,omitempty"`
}

type lifecycleBody struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

func decode(r *http.Request, v any) error {
	if r.Body == nil || r.ContentLength == 0 {
		return nil
	}
	if err := json.NewDecoder(r.Body).Decode(v); err != nil && !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errf(http.StatusRequestEntityTooLarge, "request body: larger than %d bytes", tooBig.Limit)
		}
		return errf(http.StatusBadRequest, "request body: %v", err)
	}
	return nil
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// timeoutOf is the lifetime a create, fork or resume asks for: the
// default when it names none, else more than 0 and at most maxTimeout,
// which E2B's API refuses with 400 too.
func timeoutOf(sec *int64) (time.Duration, error) {
	if sec == nil {
		return defaultTimeout, nil
	}
	if *sec <= 0 {
		return 0, errf(http.StatusBadRequest, "timeout: must be greater than 0 (got %d s)", *sec)
	}
	if *sec > int64(maxTimeout/time.Second) {
		return 0, errf(http.StatusBadRequest, "timeout: %d s is more than %d", *sec, int64(maxTimeout/time.Second))
	}
	return time.Duration(*sec) * time.Second, nil
}

// clampedTimeout is setTimeout's: E2B's API takes any number there and
// clamps it, a negative one to 0 (the sandbox ends now) and a long one to
// the longest lifetime.
func clampedTimeout(sec int64) time.Duration {
	return time.Duration(min(max(sec, 0), int64(maxTimeout/time.Second))) * time.Second
}

func (s *Server) create(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b createBody
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if err := b.validate(); err != nil {
		return 0, nil, err
	}
	if b.TemplateID == "" {
		b.TemplateID = "base"
	}
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		return 0, nil, err
	}
	now := s.now()
	l := launch{
		ns: ns, id: s.newID(), ann: map[string]string{
			annStartedAt: now.UTC().Format(time.RFC3339Nano),
			annEndAt:     now.Add(timeout).UTC().Format(time.RFC3339Nano),
			annAutoPause: strconv.FormatBool(b.AutoPause != nil && *b.AutoPause),
			annGen:       "0",
		},
		newSecret: true,
	}
	if tpl, ok := s.Templates[b.TemplateID]; ok {
		l.tpl, l.podEnv, l.env, l.token = tpl, b.EnvVars, b.EnvVars, newToken()
		l.ann[annTemplate] = b.TemplateID
	} else if err := s.fromCheckpoint(ctx, &l, b.TemplateID, b.EnvVars); err != nil {
		return 0, nil, err
	}
	l.ann[annMetadata] = jsonString(b.Metadata)
	if b.AutoResume != nil && b.AutoResume.Enabled {
		l.ann[annAutoResume] = "true" // the gateway resumes it on its first request
	}
	l.ann[annEnv] = jsonString(l.env)
	if err := s.start(ctx, l); err != nil {
		return 0, nil, err
	}
	s.Log.Info("sandbox created", "namespace", ns, "sandbox", l.id, "template", b.TemplateID)
	return http.StatusCreated, s.sandboxBody(l.id, b.TemplateID, l.token), nil
}

func jsonString(m map[string]string) string {
	b, _ := json.Marshal(orEmpty(m))
	return string(b)
}

// launch is one new pod of a sandbox: its first (a template's, a
// snapshot's, a fork's) or a resumed one.
type launch struct {
	ns, id string
	gen    int
	tpl    Template
	podEnv map[string]string // the container's environment
	env    map[string]string // envd's defaults for new processes (/init)
	ann    map[string]string // the pod's annotations
	token  string
	// newSecret: the sandbox id is new, so is its token Secret.
	newSecret bool
	// resumes is the pause Checkpoint a resume restores as this pod;
	// start marks it (markResumed).
	resumes *cryov1.Checkpoint
}

// start creates the pod of l, waits until it runs and hands envd its
// token. On failure it removes what it created, so that a failed create
// leaves nothing and a failed resume leaves the sandbox paused.
func (s *Server) start(ctx context.Context, l launch) (retErr error) {
	undo := context.WithoutCancel(ctx)
	if l.newSecret {
		if err := s.saveToken(ctx, l.ns, tokenSecretName(l.id), map[string]string{LabelSandbox: l.id}, nil, l.token); err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				if err := s.deleteSecret(undo, l.ns, tokenSecretName(l.id)); err != nil {
					s.Log.Error(err, "undo a failed sandbox start", "sandbox", l.id)
				}
			}
		}()
	}
	l.ann[AnnotationEnvdTokenSHA256] = tokenHash(l.token)
	pod := s.pod(l.ns, l.id, l.gen, l.tpl, l.podEnv, l.ann)
	if err := s.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	defer func() {
		if retErr != nil {
			if err := s.Client.Delete(undo, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				s.Log.Error(err, "undo a failed sandbox start", "sandbox", l.id, "pod", pod.Name)
			}
		}
	}()
	if l.resumes != nil {
		if err := s.markResumed(ctx, l.resumes, pod, true); err != nil {
			return err
		}
		// Run before the pod's delete above (defers run last first): a
		// mark naming a pod that is gone would make the sandbox gone,
		// where a failed resume leaves it paused.
		defer func() {
			if retErr != nil {
				if err := s.markResumed(undo, l.resumes, pod, false); err != nil {
					s.Log.Error(err, "undo a failed sandbox start", "sandbox", l.id, "checkpoint", l.resumes.Name)
				}
			}
		}()
	}
	running, err := s.waitRunning(ctx, l.ns, pod.Name, pod.UID)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", l.id, err)
	}
	if err := s.initEnvd(ctx, running, l); err != nil {
		return fmt.Errorf("sandbox %s: %w", l.id, err)
	}
	return nil
}

// markResumed sets (on) or removes (off) the mark on cp, the pause
// Checkpoint that pod restores, that a resume made pod its sandbox's next
// generation, with the end time that resume gave it. A merge patch of the
// two annotations alone: nothing else of cp changes, whatever cp's copy
// here holds.
func (s *Server) markResumed(ctx context.Context, cp *cryov1.Checkpoint, pod *corev1.Pod, on bool) error {
	ann := map[string]*string{annResumedAs: nil, annResumedEndAt: nil}
	if on {
		ann[annResumedAs], ann[annResumedEndAt] = ptr(pod.Name), ptr(pod.Annotations[annEndAt])
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	if err := s.Client.Patch(ctx, cp.DeepCopy(), client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("mark Checkpoint %s resumed as pod %s: %w", cp.Name, pod.Name, err)
	}
	return nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func (s *Server) sandboxBody(id, template, token string) sandboxBody {
	return sandboxBody{SandboxID: id, TemplateID: template, ClientID: "cryo", EnvdVersion: envdVersion, EnvdAccessToken: &token}
}

// pod is a sandbox's pod of generation gen: the first is gen 0, each
// resume the next (a new name, since the paused one may still be going).
func (s *Server) pod(ns, id string, gen int, tpl Template, env map[string]string, ann map[string]string) *corev1.Pod {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var envs []corev1.EnvVar
	for _, k := range keys {
		envs = append(envs, corev1.EnvVar{Name: k, Value: env[k]})
	}
	rc := s.RuntimeClass
	if s.DefaultStore != "" && ann[controller.AnnotationCheckpointTo] == "" {
		ann = maps.Clone(ann)
		ann[controller.AnnotationCheckpointTo] = controller.DefaultTarget(s.DefaultStore, ns, podName(id, gen))
	}
	// LabelRuntimeClass as the webhook sets it: the gateway's cache holds
	// only pods with it, and the webhook may be down (its failurePolicy
	// lets the pod through unlabelled).
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   ns,
			Name:        podName(id, gen),
			Labels:      map[string]string{LabelSandbox: id, controller.LabelRuntimeClass: rc},
			Annotations: ann,
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &rc,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr(int64(0)),
			Containers: []corev1.Container{{
				Name:    "sandbox",
				Image:   tpl.Image,
				Command: tpl.Command,
				Env:     envs,
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

func podName(id string, gen int) string { return fmt.Sprintf("e2b-%s-%d", id, gen) }

func (s *Server) newID() string {
	if s.NewID != nil {
		return s.NewID()
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// sandbox is what the cluster holds of one sandbox id.
type sandbox struct {
	id   string
	ns   string
	pod  *corev1.Pod         // the live pod, nil when paused
	last *cryov1.Checkpoint  // the newest Checkpoint, nil if never paused
	all  []cryov1.Checkpoint // every Checkpoint of the sandbox
	pods []corev1.Pod        // every pod, terminating ones too
}

func (sb *sandbox) state() string {
	if sb.pod != nil {
		return "running"
	}
	return "paused"
}

// annotations are the sandbox's E2B fields: on its pod while it runs, on
// its newest Checkpoint while it is paused.
func (sb *sandbox) annotations() map[string]string {
	if sb.pod != nil {
		return sb.pod.Annotations
	}
	return sb.last.Annotations
}

func generation(ann map[string]string) int {
	g, _ := strconv.Atoi(ann[annGen])
	return g
}

// lookup finds sandbox id in ns; found is false when it is neither
// running nor paused (unknown, killed, ended: see endedPod, gone with
// its resumed pod: see resumedGone, or a pause that has not finished).
func (s *Server) lookup(ctx context.Context, ns, id string) (*sandbox, bool, error) {
	pods, cps, err := sandboxObjects(ctx, s.Client, client.InNamespace(ns), client.MatchingLabels{LabelSandbox: id})
	if err != nil {
		return nil, false, err
	}
	sb, found := assemble(ns, id, pods, cps)
	return s.settle(ctx, sb, found)
}

// settle is sb as the API server has it when sb, from lists of the API
// server or of a cache, looks resumed and gone (resumedGone): the lists
// can miss a resume's pod that its mark already names. The API server's
// lists are of pods, then of Checkpoints, so a resume between them shows
// the mark without the pod; a cache's informers for pods and Checkpoints
// trail it each at its own pace. One read of that pod by name tells; when
// it is gone or going, one read of the Checkpoint a pause of it would
// have made (its name) tells whether a pause took it away, which a cache
// lagging behind the pause would not show. This state is rare (a resumed
// pod deleted outside a pause, or the moment of a resume), so every other
// sandbox costs nothing more.
func (s *Server) settle(ctx context.Context, sb *sandbox, found bool) (*sandbox, bool, error) {
	name := resumedGone(sb)
	if name == "" {
		return sb, found, nil
	}
	pod, cp, err := s.resumedObjects(ctx, client.ObjectKey{Namespace: sb.ns, Name: name}, true)
	if err != nil {
		return nil, false, err
	}
	pods, cps := sb.pods, sb.all
	if pod != nil {
		pods = append(slices.DeleteFunc(slices.Clone(pods), func(p corev1.Pod) bool { return p.Name == name }), *pod)
	}
	if cp != nil {
		cps = append(slices.DeleteFunc(slices.Clone(cps), func(c cryov1.Checkpoint) bool { return c.Name == name }), *cp)
	}
	sb, found = assemble(sb.ns, sb.id, pods, cps)
	return sb, found, nil
}

// resumedObjects reads, from the API server, pod key and, when it is
// gone or going and checkpoint is set, the Checkpoint of the same name
// unless that failed: what settle and the gateway need to know of a
// sandbox resumed as that pod. Either is nil when it is not there.
func (s *Server) resumedObjects(ctx context.Context, key client.ObjectKey, checkpoint bool) (*corev1.Pod, *cryov1.Checkpoint, error) {
	var pod *corev1.Pod
	var p corev1.Pod
	switch err := s.Client.Get(ctx, key, &p); {
	case err == nil:
		pod = &p
	case !apierrors.IsNotFound(err):
		return nil, nil, fmt.Errorf("get pod %s: %w", key, err)
	}
	if !checkpoint || (pod != nil && pod.DeletionTimestamp == nil) {
		return pod, nil, nil
	}
	var cp cryov1.Checkpoint
	switch err := s.Client.Get(ctx, key, &cp); {
	case apierrors.IsNotFound(err):
		return pod, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("get Checkpoint %s: %w", key, err)
	case cp.Status.Phase == cryov1.PhaseFailed:
		return pod, nil, nil
	}
	return pod, &cp, nil
}

// sandboxObjects are the pods and the Checkpoints that opts select in r
// (the API server or a cache): what assemble makes sandboxes of.
func sandboxObjects(ctx context.Context, r client.Reader, opts ...client.ListOption) ([]corev1.Pod, []cryov1.Checkpoint, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, opts...); err != nil {
		return nil, nil, fmt.Errorf("list pods: %w", err)
	}
	var cps cryov1.CheckpointList
	if err := r.List(ctx, &cps, opts...); err != nil {
		return nil, nil, fmt.Errorf("list Checkpoints: %w", err)
	}
	return pods.Items, cps.Items, nil
}

// assemble is lookup's answer from the pods and Checkpoints labelled id
// in ns.
func assemble(ns, id string, pods []corev1.Pod, cps []cryov1.Checkpoint) (*sandbox, bool) {
	sb := &sandbox{id: id, ns: ns, pods: pods, all: cps}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			if sb.pod == nil || generation(p.Annotations) > generation(sb.pod.Annotations) {
				sb.pod = p
			}
		}
	}
	for i := range cps {
		c := &cps[i]
		if sb.last == nil || generation(c.Annotations) > generation(sb.last.Annotations) {
			sb.last = c
		}
	}
	return sb, sb.pod != nil || (sb.last != nil && sb.last.Status.Phase == cryov1.PhaseSucceeded && endedPod(sb) == nil && resumedGone(sb) == "")
}

func livePods(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// mustFind finds sandbox id or answers 404. A sandbox between its pod's
// deletion and its pause Checkpoint's Succeeded (keepRunning false deletes
// the pod first) is not gone: it is found once the pause settles, as
// connect finds it (findSettled).
func (s *Server) mustFind(ctx context.Context, ns, id string) (*sandbox, error) {
	sb, ok, err := s.lookup(ctx, ns, id)
	switch {
	case err != nil:
		return nil, err
	case !ok && pausingSandbox(sb):
		return s.findSettled(ctx, ns, id)
	case !ok:
		return nil, errf(http.StatusNotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

func (s *Server) detail(sb *sandbox) listedBody {
	ann := sb.annotations()
	var meta map[string]string
	_ = json.Unmarshal([]byte(ann[annMetadata]), &meta)
	lc := &lifecycleBody{OnTimeout: "kill"}
	if ann[annAutoPause] == "true" {
		lc.OnTimeout = "pause"
	}
	lc.AutoResume = ann[annAutoResume] == "true"
	d := listedBody{
		SandboxID:   sb.id,
		TemplateID:  templateID(ann),
		ClientID:    "cryo",
		StartedAt:   ann[annStartedAt],
		EndAt:       ann[annEndAt],
		CPUCount:    1,
		EnvdVersion: envdVersion,
		Metadata:    orEmpty(meta),
		State:       sb.state(),
		Lifecycle:   lc,
	}
	if sb.pod != nil && len(sb.pod.Spec.Containers) > 0 {
		lim := sb.pod.Spec.Containers[0].Resources.Limits
		if c, ok := lim[corev1.ResourceCPU]; ok && c.Value() > 0 {
			d.CPUCount = c.Value()
		}
		if m, ok := lim[corev1.ResourceMemory]; ok {
			d.MemoryMB = m.Value() >> 20
		}
	}
	return d
}

func (s *Server) get(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.detail(sb), nil
}

func (s *Server) kill(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	sb, ok, err := s.lookup(ctx, ns, id)
	if err != nil {
		return 0, nil, err
	}
	if !ok && len(livePods(sb.pods)) == 0 && len(sb.all) == 0 {
		return 0, nil, errf(http.StatusNotFound, "sandbox %q not found", id)
	}
	if err := s.remove(ctx, sb); err != nil {
		return 0, nil, err
	}
	s.Log.Info("sandbox killed", "namespace", ns, "sandbox", id)
	return http.StatusNoContent, nil, nil
}

// remove deletes every pod and Checkpoint of a sandbox, and its token.
func (s *Server) remove(ctx context.Context, sb *sandbox) error {
	for i := range sb.pods {
		if err := s.Client.Delete(ctx, &sb.pods[i], client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", sb.pods[i].Name, err)
		}
	}
	for i := range sb.all {
		if err := s.Client.Delete(ctx, &sb.all[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete Checkpoint %s: %w", sb.all[i].Name, err)
		}
	}
	return s.deleteSecret(ctx, sb.ns, tokenSecretName(sb.id))
}

func (s *Server) setTimeout(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.Timeout == nil {
		return 0, nil, errf(http.StatusBadRequest, "timeout: required")
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	// Only a running sandbox has a timeout to set, as in E2B: a paused
	// one's is given by the connect that resumes it.
	switch {
	case sb.pod == nil:
		return 0, nil, errf(http.StatusNotFound, "sandbox %q is paused: connect resumes it, with its timeout", sb.id)
	case pausing(sb):
		return 0, nil, errf(http.StatusConflict, "sandbox %q is pausing", sb.id)
	}
	if err := s.setEndAt(ctx, sb, s.now().Add(clampedTimeout(*b.Timeout))); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// setEndAt sets a running sandbox's end time (on its pod).
func (s *Server) setEndAt(ctx context.Context, sb *sandbox, at time.Time) error {
	patch := client.MergeFrom(sb.pod.DeepCopy())
	if sb.pod.Annotations == nil {
		sb.pod.Annotations = map[string]string{}
	}
	sb.pod.Annotations[annEndAt] = at.UTC().Format(time.RFC3339Nano)
	if err := s.Client.Patch(ctx, sb.pod, patch); err != nil {
		return fmt.Errorf("set the end time of sandbox %s: %w", sb.id, err)
	}
	return nil
}
