package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// Kubelet asks a node's kubelet to checkpoint a container. The real one
// goes through the API server's node proxy; tests fake it.
type Kubelet interface {
	Checkpoint(ctx context.Context, node, namespace, pod, container string, timeout time.Duration) error
}

// KubeletError is a failed checkpoint call. Transient ones (the proxy or
// kubelet unreachable or overloaded, or the kubelet not yet aware of the
// pod) are retried until the deadline.
type KubeletError struct {
	StatusCode int // 0: no HTTP answer
	Err        error
	// Body is the kubelet's own answer when the API server's proxy passed
	// on one that is not an API status (the kubelet writes plain text).
	Body string
}

func (e *KubeletError) Error() string {
	msg := fmt.Sprintf("kubelet checkpoint: HTTP %d: %v", e.StatusCode, e.Err)
	if e.StatusCode == 0 {
		msg = fmt.Sprintf("kubelet checkpoint: %v", e.Err)
	}
	// The generic 404's message leaves the kubelet's answer out; a
	// 500's has it already.
	if e.Body != "" && !strings.Contains(msg, e.Body) {
		msg += ": " + e.Body
	}
	return msg
}

func (e *KubeletError) Unwrap() error { return e.Err }

// Transient says whether the call is worth repeating: no answer at all, or
// a gateway, throttling or unavailability answer (the API server's proxy
// says 502/503 when it cannot reach the kubelet). A 500 is the kubelet
// reporting that the runtime's checkpoint failed: retried a few times by
// the reconciler, not until the deadline.
//
// A kubelet's 404 that says the pod or its container does not exist is
// transient too: a kubelet that has just started answers so for about a
// second (measured: from 0.3 s to 1.4 s after its port opened) for the
// pods it runs, until it has read them from the API server, and so does
// one that has not yet seen a new pod. The reconciler asks the API server
// for the pod before every retry, so a pod that is really gone fails
// there. Any other 404 (a kubelet without the checkpoint API answers
// "404 page not found") fails at once.
func (e *KubeletError) Transient() bool {
	switch e.StatusCode {
	case 0, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout,
		http.StatusTooManyRequests, http.StatusRequestTimeout:
		return true
	case http.StatusNotFound:
		return strings.HasSuffix(e.Body, " does not exist")
	}
	return false
}

// kubeletBody is the kubelet's plain-text answer that the proxy passed on,
// which client-go keeps as a cause of the error it makes of it.
func kubeletBody(status apierrors.APIStatus) string {
	d := status.Status().Details
	if d == nil {
		return ""
	}
	for _, c := range d.Causes {
		if c.Type == metav1.CauseTypeUnexpectedServerResponse {
			return strings.TrimSpace(c.Message)
		}
	}
	return ""
}

// NodeProxyKubelet calls POST /api/v1/nodes/{node}/proxy/checkpoint/...
// with the controller's own credentials (RBAC create on nodes/proxy).
type NodeProxyKubelet struct {
	// REST is the core/v1 REST client of a clientset.
	REST rest.Interface
}

// Checkpoint asks the kubelet to checkpoint and waits for its answer; the
// kubelet's own timeout is timeout (whole seconds, at least one).
func (k NodeProxyKubelet) Checkpoint(ctx context.Context, node, namespace, pod, container string, timeout time.Duration) error {
	secs := int64((timeout + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	// The request outlives the kubelet's timeout a little so that its
	// answer, not our cut, says how the call ended.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	var code int
	res := k.REST.Post().AbsPath("/api/v1/nodes", node, "proxy", "checkpoint", namespace, pod, container).
		Param("timeout", strconv.FormatInt(secs, 10)).Do(ctx).StatusCode(&code)
	err := res.Error()
	if err == nil {
		return nil
	}
	var body string
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if code == 0 {
			code = int(status.Status().Code)
		}
		body = kubeletBody(status)
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, context.DeadlineExceeded) {
		code = 0
	}
	return &KubeletError{StatusCode: code, Err: err, Body: body}
}
