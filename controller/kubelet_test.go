package controller

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestNodeProxyKubelet: the request the API server's node proxy gets, and
// how its answers are classified.
func TestNodeProxyKubelet(t *testing.T) {
	var method, path, timeout string
	status := http.StatusOK
	body := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, path, timeout = r.Method, r.URL.Path, r.URL.Query().Get("timeout")
		if body != "" {
			// The kubelet's own errors, as go-restful writes them.
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"items":["/var/lib/kubelet/checkpoints/checkpoint-web.tar"]}`))
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	k := NodeProxyKubelet{REST: cs.CoreV1().RESTClient()}
	ctx := context.Background()
	if err := k.Checkpoint(ctx, "node-1", "team-a", "web", "app", 90*time.Second+time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if method != http.MethodPost || path != "/api/v1/nodes/node-1/proxy/checkpoint/team-a/web/app" || timeout != "91" {
		t.Errorf("request %s %s timeout=%s", method, path, timeout)
	}
	for code, transient := range map[int]bool{500: false, 502: true, 503: true, 504: true, 429: true, 404: false, 403: false} {
		status = code
		err := k.Checkpoint(ctx, "node-1", "team-a", "web", "app", time.Second)
		var kerr *KubeletError
		if !errors.As(err, &kerr) || kerr.StatusCode != code || kerr.Transient() != transient {
			t.Errorf("HTTP %d: %v (%+v), want transient=%v", code, err, kerr, transient)
		}
	}
	// A kubelet that has not read its pods from the API server yet (it
	// has just started) says the pod does not exist: retried. A kubelet
	// without the checkpoint API: not.
	for answer, transient := range map[string]bool{
		"pod does not exist":           true,
		"container app does not exist": true,
		"404 page not found":           false,
	} {
		status, body = http.StatusNotFound, answer
		err := k.Checkpoint(ctx, "node-1", "team-a", "web", "app", time.Second)
		var kerr *KubeletError
		if !errors.As(err, &kerr) || kerr.Transient() != transient || !strings.HasSuffix(err.Error(), ": "+answer) {
			t.Errorf("HTTP 404 %q: %v (%+v), want transient=%v and the kubelet's answer in the error", answer, err, kerr, transient)
		}
	}
	status, body = http.StatusInternalServerError, "checkpointing of team-a/web/app failed (rpc error)"
	if err := k.Checkpoint(ctx, "node-1", "team-a", "web", "app", time.Second); strings.Count(err.Error(), body) != 1 {
		t.Errorf("HTTP 500: %v, want the kubelet's answer once", err)
	}
	srv.Close()
	err = k.Checkpoint(ctx, "node-1", "team-a", "web", "app", time.Second)
	var kerr *KubeletError
	if !errors.As(err, &kerr) || kerr.StatusCode != 0 || !kerr.Transient() {
		t.Errorf("API server gone: %v, want a transient error without a status", err)
	}
}
