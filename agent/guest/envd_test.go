package guest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/agent/envd"
)

// TestEnvdRequest: envd is for a pod's container with the annotation, not
// for its pause container (which carries the pod's annotations too); a
// bad hash is refused, naming the annotation.
func TestEnvdRequest(t *testing.T) {
	sum := sha256.Sum256([]byte("token"))
	good := hex.EncodeToString(sum[:])
	spec := func(typ, hash string) *specs.Spec {
		a := map[string]string{criContainerType: typ}
		if hash != "" {
			a[envd.Annotation] = hash
		}
		return &specs.Spec{Annotations: a}
	}
	if h, ok, err := envdRequest(spec("container", good)); !ok || err != nil || h != sum {
		t.Fatalf("a container with the annotation: %x %v %v", h, ok, err)
	}
	for _, s := range []*specs.Spec{spec("sandbox", good), spec("container", ""), {}} {
		if _, ok, err := envdRequest(s); ok || err != nil {
			t.Fatalf("%v: envd %v, %v; want none", s.Annotations, ok, err)
		}
	}
	_, ok, err := envdRequest(spec("container", strings.ToUpper(good)))
	if ok || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), envd.Annotation) {
		t.Fatalf("a bad hash: %v %v, want a refusal naming %s", ok, err, envd.Annotation)
	}
}

func TestNsPid(t *testing.T) {
	// the test runs in the pid namespace it sees
	if pid, err := nsPid(os.Getpid()); err != nil || int(pid) != os.Getpid() {
		t.Fatalf("nsPid(self) = %d, %v; want %d", pid, err, os.Getpid())
	}
}

func TestBufferReader(t *testing.T) {
	b := newOutputBuffer(1 << 10)
	b.Write([]byte("hello"))
	b.CloseWrite()
	got, err := io.ReadAll(bufferReader{b})
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestEnvdFollowsRestartedContainer: a container created while envd's
// container runs leaves envd where it is; once that one stopped (the
// kubelet restarts a container as a new one), envd serves the new one.
func TestEnvdFollowsRestartedContainer(t *testing.T) {
	s := NewService(NewReaper(), Config{})
	old := &container{id: "old", init: newProcess("", &helperConfig{}, StdioConfig{})}
	old.init.state = stateRunning
	s.containers["old"] = old
	s.envd, s.envdTarget = &http.Server{}, &envdContainer{c: old}
	next := &container{id: "next", init: newProcess("", &helperConfig{}, StdioConfig{})}
	ctx := context.Background()
	if err := s.startEnvd(ctx, next, [32]byte{}); err != nil || s.envdTarget.get() != old {
		t.Fatalf("while the old container runs: envd serves %s, %v", s.envdTarget.get().id, err)
	}
	old.init.setExited(Exit{})
	if err := s.startEnvd(ctx, next, [32]byte{}); err != nil || s.envdTarget.get() != next {
		t.Fatalf("after the old container stopped: envd serves %s, %v", s.envdTarget.get().id, err)
	}
}
