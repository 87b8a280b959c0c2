package e2bapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cryo-runtime/cryo/internal/envdweb"
)

const (
	// AnnotationEnvdTokenSHA256 on a sandbox's pod turns envd on in the
	// guest and is what it checks X-Access-Token against. Under cryo.dev/
	// on purpose: the node reads it (docs/e2b.md, the envd contract).
	AnnotationEnvdTokenSHA256 = "cryo.dev/envd-access-token-sha256"
	// SecretTokenField is the data key of a token Secret: e2b-<sandbox id>
	// for a sandbox, the Checkpoint's name for a snapshot.
	SecretTokenField = "envdAccessToken"

	// EnvdPort is where envd listens in the pod's network namespace.
	EnvdPort = envdweb.Port

	initAttempts = 5
	initTimeout  = 5 * time.Second
	initBackoff  = time.Second
	eventsEvery  = 2 * time.Second
	eventsMax    = 30 * time.Second
)

// newToken is a sandbox's envd access token: 32 random bytes, hex.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func tokenSecretName(id string) string { return "e2b-" + id }

// saveToken stores a token in Secret ns/name. The plain token lives only
// there and in the guest's envd; pods and Checkpoints carry its hash.
func (s *Server) saveToken(ctx context.Context, ns, name string, labels map[string]string, owner *metav1.OwnerReference, token string) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Data:       map[string][]byte{SecretTokenField: []byte(token)},
	}
	if owner != nil {
		sec.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	if err := s.Client.Create(ctx, sec); err != nil {
		return fmt.Errorf("create envd token Secret %s: %w", name, err)
	}
	return nil
}

// token reads the token Secret ns/name.
func (s *Server) token(ctx context.Context, ns, name string) (string, error) {
	var sec corev1.Secret
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", errf(http.StatusInternalServerError, "envd token Secret %s/%s is missing", ns, name)
		}
		return "", fmt.Errorf("read envd token Secret %s: %w", name, err)
	}
	t := string(sec.Data[SecretTokenField])
	if t == "" {
		return "", errf(http.StatusInternalServerError, "envd token Secret %s/%s has no %s", ns, name, SecretTokenField)
	}
	return t, nil
}

func (s *Server) deleteSecret(ctx context.Context, ns, name string) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := s.Client.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete envd token Secret %s: %w", name, err)
	}
	return nil
}

func (s *Server) startWait() time.Duration {
	if s.StartWait > 0 {
		return s.StartWait
	}
	return 5 * time.Minute
}

// waitRunning waits until pod ns/name (uid, when known) runs and has an
// address: envd answers there. A pod that ended or vanished fails at
// once, naming why. It reads the pod from Server.Cache (see watched).
func (s *Server) waitRunning(ctx context.Context, ns, name string, uid types.UID) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, s.startWait())
	defer cancel()
	w := s.watch(client.ObjectKey{Namespace: ns, Name: name}, uid, false)
	var sandboxErr string
	var p corev1.Pod // as last read: a timeout names its phase
	var nextEvents time.Time
	eventsWait := eventsEvery
	for {
		cur, err := read[corev1.Pod](ctx, w)
		switch {
		case err == nil:
			p = *cur
		case errors.Is(err, errNotCached):
		case apierrors.IsNotFound(err):
			return nil, errf(http.StatusBadGateway, "pod %s was deleted before it ran", name)
		case ctx.Err() == nil:
			return nil, fmt.Errorf("get pod %s: %w", name, err)
		}
		switch {
		case p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "":
			return &p, nil
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			return nil, errf(http.StatusBadGateway, "pod %s ended before envd answered (phase %s): %s %s", name, p.Status.Phase, p.Status.Reason, p.Status.Message)
		case refused(&p) != "":
			return nil, errf(http.StatusBadGateway, "pod %s will not start: %s", name, refused(&p))
		}
		// The runtime's refusal of the pod itself (cryo's of a bad
		// annotation) is only an Event, retried by the kubelet for ever.
		// Events are not cached (an informer on every Event of the
		// cluster would cost more than it saves): they are listed from
		// the API server once the pod has been on its node eventsEvery
		// without an address, then ever less often (eventsMax), the
		// refusal repeating anyway, so that a pod pulling a large image
		// costs a few lists and not one every eventsEvery.
		if p.Status.PodIP == "" && p.Spec.NodeName != "" {
			switch now := time.Now(); {
			case nextEvents.IsZero():
				nextEvents = now.Add(eventsWait)
			case now.After(nextEvents):
				eventsWait = min(2*eventsWait, eventsMax)
				nextEvents = now.Add(eventsWait)
				if sandboxErr = s.sandboxFailure(ctx, &p); strings.Contains(sandboxErr, "code = InvalidArgument") {
					return nil, errf(http.StatusBadGateway, "pod %s will not start: %s", name, sandboxErr)
				}
			}
		}
		select {
		case <-ctx.Done():
			if sandboxErr != "" {
				sandboxErr = ", " + sandboxErr
			}
			return nil, errf(http.StatusGatewayTimeout, "pod %s not running after %s (phase %q%s%s)", name, s.startWait(), p.Status.Phase, waitingReason(&p), sandboxErr)
		case <-time.After(s.poll()):
		}
	}
}

// sandboxFailure is the newest FailedCreatePodSandBox Event of pod p
// ("" if none, or if Events cannot be read: it only refines a diagnosis).
func (s *Server) sandboxFailure(ctx context.Context, p *corev1.Pod) string {
	var evs corev1.EventList
	if err := s.Client.List(ctx, &evs, client.InNamespace(p.Namespace), client.MatchingFields{"involvedObject.name": p.Name}); err != nil {
		s.Log.V(1).Info("list the pod's Events", "pod", p.Name, "error", err.Error())
		return ""
	}
	var newest *corev1.Event
	for i := range evs.Items {
		e := &evs.Items[i]
		if e.Reason != "FailedCreatePodSandBox" || e.InvolvedObject.UID != p.UID {
			continue
		}
		if newest == nil || eventTime(newest).Before(eventTime(e)) {
			newest = e
		}
	}
	if newest == nil {
		return ""
	}
	return newest.Reason + ": " + newest.Message
}

func eventTime(e *corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// refused names why the runtime refuses to create a container of pod p,
// which the kubelet would retry for ever: the image name, or the
// container's own configuration (cryo refuses bad cryo.dev/ annotations so).
func refused(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			switch w.Reason {
			case "CreateContainerError", "CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull":
				return fmt.Sprintf("container %s: %s: %s", c.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

// waitingReason names why a pending pod's container waits (an image pull,
// a refused annotation), the diagnosis a timeout needs.
func waitingReason(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason != "" {
			return fmt.Sprintf(", container %s waiting: %s %s", c.Name, w.Reason, w.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	return ""
}

type initBody struct {
	AccessToken string            `json:"accessToken"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
}

// newInitBody is l's /init: its token and env vars, and the sandbox's id
// and template as E2B_SANDBOX_ID and E2B_TEMPLATE_ID. E2B's envd reads
// those from its VM's metadata and keeps them over the user's env vars of
// the same names (a process's own envs still win); cryo's envd has no
// such metadata, so they come here, over the user's.
func newInitBody(l launch) initBody {
	env := maps.Clone(orEmpty(l.env)) // l.env is also the sandbox's record
	env["E2B_SANDBOX_ID"] = l.id
	env["E2B_TEMPLATE_ID"] = templateID(l.ann)
	return initBody{AccessToken: l.token, EnvVars: env}
}

// initEnvd hands envd in pod the plain token and env vars of l (POST
// /init, which envd checks against the hash it was started with).
// envd starts with the container, so right after Running it may not
// listen yet: a refused connection or a 5xx is tried again a few times;
// any other answer is final.
func (s *Server) initEnvd(ctx context.Context, pod *corev1.Pod, l launch) error {
	port := s.EnvdPort
	if port == 0 {
		port = EnvdPort
	}
	hc := s.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)) + "/init"
	body, _ := json.Marshal(newInitBody(l))
	var last error
	for attempt := 0; attempt < initAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errf(http.StatusBadGateway, "envd of pod %s: POST /init: %v (then %v)", pod.Name, last, ctx.Err())
			case <-time.After(initBackoff):
			}
		}
		code, err := s.postInit(ctx, hc, url, body)
		switch {
		case err == nil && code == http.StatusNoContent, err == nil && code == http.StatusOK:
			return nil
		case err == nil && code < 500:
			return errf(http.StatusBadGateway, "envd of pod %s: POST /init answered %d", pod.Name, code)
		case err == nil:
			last = fmt.Errorf("answered %d", code)
		default:
			last = err
		}
	}
	return errf(http.StatusBadGateway, "envd of pod %s did not take /init after %d attempts: %v", pod.Name, initAttempts, last)
}

func (s *Server) postInit(ctx context.Context, hc *http.Client, url string, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, initTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}
