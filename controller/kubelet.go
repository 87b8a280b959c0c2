package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// Kubelet asks a node's kubelet to checkpoint a container. The real one
// goes through the API server's node proxy; tests fake it.
type Kubelet interface {
	Checkpoint(ctx context.Context, node, namespace, pod, container string, timeout time.Duration) error
}

// KubeletError is a failed checkpoint call. Transient ones (the proxy or
// kubelet unreachable or overloaded) are retried until the deadline.
type KubeletError struct {
	StatusCode int // 0: no HTTP answer
	Err        error
}

func (e *KubeletError) Error() string {
	if e.StatusCode == 0 {
		return fmt.Sprintf("kubelet checkpoint: %v", e.Err)
	}
	return fmt.Sprintf("kubelet checkpoint: HTTP %d: %v", e.StatusCode, e.Err)
}

func (e *KubeletError) Unwrap() error { return e.Err }

// Transient says whether the call is worth repeating: no answer at all, or
// a gateway, throttling or unavailability answer (the API server's proxy
// says 502/503 when it cannot reach the kubelet). A 500 is the kubelet
// reporting that the runtime's checkpoint failed: retried a few times by
// the reconciler, not until the deadline.
func (e *KubeletError) Transient() bool {
	switch e.StatusCode {
	case 0, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout,
		http.StatusTooManyRequests, http.StatusRequestTimeout:
		return true
	}
	return false
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
	var status apierrors.APIStatus
	if errors.As(err, &status) && code == 0 {
		code = int(status.Status().Code)
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, context.DeadlineExceeded) {
		code = 0
	}
	return &KubeletError{StatusCode: code, Err: err}
}
