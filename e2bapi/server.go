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
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	// envdVersion is what the SDK is told the sandbox runs: it refuses
	// anything below 0.1.0. envd itself is not built yet (docs/e2b.md).
	envdVersion = "0.2.0"

	defaultTimeout = 300 * time.Second
	maxTimeout     = 24 * time.Hour
)

// Template is what a templateID starts: an image running Command.
type Template struct {
	Image   string
	Command []string
}

// Server is the API. Client reads and writes the cluster without a cache,
// so that no informer on Secrets or pods is started for it.
type Server struct {
	Client       client.Client
	Namespace    string // the controller's namespace, home of the key Secrets
	RuntimeClass string
	Templates    map[string]Template
	PauseWait    time.Duration // how long a pause waits for its Checkpoint
	Log          logr.Logger
	Now          func() time.Time
	NewID        func() string
	PollInterval time.Duration
	ReapInterval time.Duration
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
	route("POST /v2/sandboxes", s.create)
	route("GET /v2/sandboxes", s.list)
	route("GET /sandboxes/{id}", s.get)
	route("DELETE /sandboxes/{id}", s.kill)
	route("POST /sandboxes/{id}/timeout", s.setTimeout)
	route("POST /sandboxes/{id}/pause", s.pause)
	route("POST /v2/sandboxes/{id}/connect", s.connect)
	for _, p := range []string{
		"POST /sandboxes/{id}/snapshots", "GET /snapshots", "POST /sandboxes/{id}/fork",
		"GET /sandboxes/{id}/metrics", "PUT /sandboxes/{id}/network", "/templates", "/templates/",
		"/v2/templates", "/v2/templates/", "/v3/templates", "/volumes", "/volumes/", "/secrets", "/secrets/",
	} {
		route(p, func(context.Context, string, *http.Request) (int, any, error) {
			return 0, nil, errf(http.StatusNotImplemented, "not supported by cryo's E2B API (docs/e2b.md): snapshots, fork, metrics, network updates, template builds, volumes and secrets")
		})
	}
	route("/", func(_ context.Context, _ string, r *http.Request) (int, any, error) {
		return 0, nil, errf(http.StatusNotFound, "no route %s %s", r.Method, r.URL.Path)
	})
	return mux
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, h func(ctx context.Context, ns string, r *http.Request) (int, any, error)) {
	ctx := r.Context()
	code, body, err := 0, any(nil), error(nil)
	ns, err := s.authenticate(ctx, r.Header.Get("X-API-Key"))
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
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// authenticate maps an API key to its namespace.
func (s *Server) authenticate(ctx context.Context, key string) (string, error) {
	bad := errf(http.StatusUnauthorized, "Invalid API key")
	if key == "" {
		return "", bad
	}
	var secrets corev1.SecretList
	if err := s.Client.List(ctx, &secrets, client.InNamespace(s.Namespace), client.HasLabels{LabelAPIKey}); err != nil {
		return "", fmt.Errorf("list API key Secrets: %w", err)
	}
	for _, sec := range secrets.Items {
		want := sec.Data[SecretKeyField]
		if len(want) == 0 || subtle.ConstantTimeCompare(want, []byte(key)) != 1 {
			continue
		}
		ns := sec.Annotations[AnnotationKeyNamespace]
		if ns == "" {
			return "", errf(http.StatusUnauthorized, "API key Secret %s has no annotation %s", sec.Name, AnnotationKeyNamespace)
		}
		return ns, nil
	}
	return "", bad
}

// createBody is the SDK's NewSandbox.
type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
	MCP          json.RawMessage   `json:"mcp"`
	Secure       *bool             `json:"secure"`
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
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
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

func timeoutOf(sec *int64) (time.Duration, error) {
	if sec == nil {
		return defaultTimeout, nil
	}
	d := time.Duration(*sec) * time.Second
	if *sec < 0 || d > maxTimeout {
		return 0, errf(http.StatusBadRequest, "timeout: %d s is outside 0..%d", *sec, int64(maxTimeout/time.Second))
	}
	return d, nil
}

func (s *Server) create(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b createBody
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	switch {
	case len(b.VolumeMounts) > 0:
		return 0, nil, errf(http.StatusBadRequest, "volumeMounts: volumes are not supported by cryo's E2B API")
	case len(b.MCP) > 0 && string(b.MCP) != "null":
		return 0, nil, errf(http.StatusBadRequest, "mcp: not supported by cryo's E2B API")
	}
	if b.TemplateID == "" {
		b.TemplateID = "base"
	}
	tpl, ok := s.Templates[b.TemplateID]
	if !ok {
		return 0, nil, errf(http.StatusNotFound, "template %q not found", b.TemplateID)
	}
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		return 0, nil, err
	}
	id := s.newID()
	now := s.now()
	meta, _ := json.Marshal(orEmpty(b.Metadata))
	env, _ := json.Marshal(orEmpty(b.EnvVars))
	ann := map[string]string{
		annTemplate:  b.TemplateID,
		annMetadata:  string(meta),
		annEnv:       string(env),
		annStartedAt: now.UTC().Format(time.RFC3339Nano),
		annEndAt:     now.Add(timeout).UTC().Format(time.RFC3339Nano),
		annAutoPause: strconv.FormatBool(b.AutoPause != nil && *b.AutoPause),
		annGen:       "0",
	}
	if b.AutoResume != nil && b.AutoResume.Enabled {
		ann[annAutoResume] = "true" // the gateway resumes it on its first request
	}
	pod := s.pod(ns, id, 0, tpl, b.EnvVars, ann)
	if err := s.Client.Create(ctx, pod); err != nil {
		return 0, nil, fmt.Errorf("create pod: %w", err)
	}
	s.Log.Info("sandbox created", "namespace", ns, "sandbox", id, "template", b.TemplateID)
	return http.StatusCreated, s.sandboxBody(id, b.TemplateID), nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func (s *Server) sandboxBody(id, template string) sandboxBody {
	return sandboxBody{SandboxID: id, TemplateID: template, ClientID: "cryo", EnvdVersion: envdVersion}
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
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   ns,
			Name:        podName(id, gen),
			Labels:      map[string]string{LabelSandbox: id},
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
// running nor paused (unknown, killed, or a pause that has not finished).
func (s *Server) lookup(ctx context.Context, ns, id string) (*sandbox, bool, error) {
	sb := &sandbox{id: id}
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{LabelSandbox: id}); err != nil {
		return nil, false, fmt.Errorf("list pods: %w", err)
	}
	sb.pods = pods.Items
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			if sb.pod == nil || generation(p.Annotations) > generation(sb.pod.Annotations) {
				sb.pod = p
			}
		}
	}
	var cps cryov1.CheckpointList
	if err := s.Client.List(ctx, &cps, client.InNamespace(ns), client.MatchingLabels{LabelSandbox: id}); err != nil {
		return nil, false, fmt.Errorf("list Checkpoints: %w", err)
	}
	sb.all = cps.Items
	for i := range cps.Items {
		c := &cps.Items[i]
		if sb.last == nil || generation(c.Annotations) > generation(sb.last.Annotations) {
			sb.last = c
		}
	}
	if sb.pod != nil {
		return sb, true, nil
	}
	if sb.last != nil && sb.last.Status.Phase == cryov1.PhaseSucceeded {
		return sb, true, nil
	}
	return sb, false, nil
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

func (s *Server) mustFind(ctx context.Context, ns, id string) (*sandbox, error) {
	sb, ok, err := s.lookup(ctx, ns, id)
	if err != nil {
		return nil, err
	}
	if !ok {
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
		TemplateID:  ann[annTemplate],
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

func (s *Server) list(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return 0, nil, errf(http.StatusBadRequest, "state: %q is neither running nor paused", st)
			}
			states[st] = true
		}
	}
	if len(states) == 0 {
		states = map[string]bool{"running": true, "paused": true}
	}
	want, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return 0, nil, err
	}
	ids, err := s.ids(ctx, ns)
	if err != nil {
		return 0, nil, err
	}
	out := []listedBody{}
	for _, id := range ids {
		sb, ok, err := s.lookup(ctx, ns, id)
		if err != nil {
			return 0, nil, err
		}
		if !ok || !states[sb.state()] {
			continue
		}
		d := s.detail(sb)
		if matches(d.Metadata, want) {
			out = append(out, d)
		}
	}
	return http.StatusOK, out, nil
}

// metadataFilter decodes the SDK's metadata query: a URL-encoded query
// string of URL-encoded keys and values.
func metadataFilter(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	pairs, err := parseQuery(v)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "metadata: %v", err)
	}
	return pairs, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// ids are the sandbox ids with a pod or a Checkpoint in ns, sorted.
func (s *Server) ids(ctx context.Context, ns string) ([]string, error) {
	seen := map[string]bool{}
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(ns), client.HasLabels{LabelSandbox}); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for _, p := range pods.Items {
		seen[p.Labels[LabelSandbox]] = true
	}
	var cps cryov1.CheckpointList
	if err := s.Client.List(ctx, &cps, client.InNamespace(ns), client.HasLabels{LabelSandbox}); err != nil {
		return nil, fmt.Errorf("list Checkpoints: %w", err)
	}
	for _, c := range cps.Items {
		seen[c.Labels[LabelSandbox]] = true
	}
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
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

// remove deletes every pod and Checkpoint of a sandbox.
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
	return nil
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
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if err := s.setEndAt(ctx, sb, s.now().Add(timeout)); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (s *Server) setEndAt(ctx context.Context, sb *sandbox, at time.Time) error {
	var obj client.Object = sb.last
	if sb.pod != nil {
		obj = sb.pod
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	ann := obj.GetAnnotations()
	ann[annEndAt] = at.UTC().Format(time.RFC3339Nano)
	obj.SetAnnotations(ann)
	if err := s.Client.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("set the end time of sandbox %s: %w", sb.id, err)
	}
	return nil
}

func (s *Server) pause(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.pod == nil {
		return 0, nil, errf(http.StatusConflict, "sandbox %q is already paused", sb.id)
	}
	if err := s.checkpoint(ctx, sb); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// checkpoint hibernates a running sandbox: a Checkpoint with keepRunning
// false carrying the sandbox's E2B annotations, then waits until it has
// Succeeded and the pod is gone, so that the SDK's pause returns with the
// sandbox paused.
func (s *Server) checkpoint(ctx context.Context, sb *sandbox) error {
	ann := map[string]string{}
	for _, k := range []string{annTemplate, annMetadata, annEnv, annStartedAt, annEndAt, annAutoPause, annGen, annAutoResume} {
		ann[k] = sb.pod.Annotations[k]
	}
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   sb.pod.Namespace,
			Name:        sb.pod.Name,
			Labels:      map[string]string{LabelSandbox: sb.id},
			Annotations: ann,
		},
		Spec: cryov1.CheckpointSpec{PodName: sb.pod.Name, KeepRunning: ptr(false)},
	}
	if err := s.Client.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Checkpoint: %w", err)
	}
	s.Log.Info("sandbox pausing", "namespace", cp.Namespace, "sandbox", sb.id, "checkpoint", cp.Name)
	wait := s.PauseWait
	if wait == 0 {
		wait = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		var cur cryov1.Checkpoint
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(cp), &cur); err != nil {
			return fmt.Errorf("pause of sandbox %s: %w", sb.id, err)
		}
		if cur.Status.Phase == cryov1.PhaseFailed {
			// Gone, so that the next pause can try again under its name.
			if err := s.Client.Delete(ctx, &cur); err != nil && !apierrors.IsNotFound(err) {
				s.Log.Error(err, "delete failed Checkpoint", "checkpoint", cp.Name)
			}
			return fmt.Errorf("pause of sandbox %s: Checkpoint %s failed: %s: %s", sb.id, cp.Name, cur.Status.Reason, cur.Status.Message)
		}
		if cur.Status.Phase == cryov1.PhaseSucceeded {
			var p corev1.Pod
			err := s.Client.Get(ctx, client.ObjectKeyFromObject(sb.pod), &p)
			if apierrors.IsNotFound(err) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errf(http.StatusGatewayTimeout, "pause of sandbox %s: Checkpoint %s not done after %s (phase %q)", sb.id, cp.Name, wait, cur.Status.Phase)
		case <-time.After(s.poll()):
		}
	}
}

func (s *Server) poll() time.Duration {
	if s.PollInterval > 0 {
		return s.PollInterval
	}
	return 250 * time.Millisecond
}

func (s *Server) connect(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.Memory != nil && !*b.Memory {
		return 0, nil, errf(http.StatusBadRequest, "memory: false (onResume reboot) is not supported: cryo always restores the memory")
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	ann := sb.annotations()
	if sb.pod != nil {
		if b.Timeout != nil {
			timeout, err := timeoutOf(b.Timeout)
			if err != nil {
				return 0, nil, err
			}
			if err := s.setEndAt(ctx, sb, s.now().Add(timeout)); err != nil {
				return 0, nil, err
			}
		}
		return http.StatusOK, s.sandboxBody(sb.id, ann[annTemplate]), nil
	}
	if err := s.resume(ctx, sb, b.Timeout); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.sandboxBody(sb.id, ann[annTemplate]), nil
}

// resume starts the next generation's pod restoring the newest Checkpoint.
func (s *Server) resume(ctx context.Context, sb *sandbox, timeoutSec *int64) error {
	cp := sb.last
	tpl, ok := s.Templates[cp.Annotations[annTemplate]]
	if !ok {
		return errf(http.StatusInternalServerError, "template %q of paused sandbox %s is no longer configured", cp.Annotations[annTemplate], sb.id)
	}
	timeout, err := timeoutOf(timeoutSec)
	if err != nil {
		return err
	}
	var env map[string]string
	_ = json.Unmarshal([]byte(cp.Annotations[annEnv]), &env)
	gen := generation(cp.Annotations) + 1
	ann := map[string]string{}
	for k, v := range cp.Annotations {
		if strings.HasPrefix(k, e2bAnnotationPrefix) {
			ann[k] = v
		}
	}
	ann[annGen] = strconv.Itoa(gen)
	ann[annEndAt] = s.now().Add(timeout).UTC().Format(time.RFC3339Nano)
	ann[controller.AnnotationRestoreCheckpoint] = cp.Name
	pod := s.pod(cp.Namespace, sb.id, gen, tpl, env, ann)
	if err := s.Client.Create(ctx, pod); err != nil {
		return fmt.Errorf("create the resumed pod of sandbox %s: %w", sb.id, err)
	}
	s.Log.Info("sandbox resumed", "namespace", cp.Namespace, "sandbox", sb.id, "checkpoint", cp.Name, "pod", pod.Name)
	return nil
}
