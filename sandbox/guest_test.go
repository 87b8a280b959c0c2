package sandbox

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestAgentRequestTimeout: a short agent call to a guest that never
// answers fails after the configured [agent] request_timeout, not the
// 30s default.
func TestAgentRequestTimeout(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	go func() { _, _ = io.Copy(io.Discard, guest) }() // reads, never answers
	ag := newAgentClient(host, 300*time.Millisecond)
	defer ag.close()
	start := time.Now()
	_, err := ag.StartProcess(context.Background(), "c1", "")
	took := time.Since(start)
	// agent.Client's interceptor turns the deadline into errdefs.ErrUnknown
	// with the deadline's message, so the time is what is checked.
	if err == nil {
		t.Fatal("call to a silent agent succeeded")
	}
	if took < 250*time.Millisecond || took > 5*time.Second {
		t.Fatalf("call to a silent agent took %s, want about the 300ms request timeout", took)
	}
	if d := newAgentClient(host, 0).timeout; d != 30*time.Second {
		t.Fatalf("zero timeout gives %s, want the 30s default", d)
	}
}
