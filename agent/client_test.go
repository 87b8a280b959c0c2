package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"

	"github.com/cryo-runtime/cryo/agent"
	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/agent/guest"
)

// fakeGuest implements Ping and fails WaitProcess like the guest does for an
// unknown container.
type fakeGuest struct{ agentapi.AgentService }

func (fakeGuest) Ping(context.Context, *agentapi.PingRequest) (*agentapi.PingResponse, error) {
	return &agentapi.PingResponse{BootId: "b", KernelRelease: "k"}, nil
}

func (fakeGuest) WaitProcess(_ context.Context, r *agentapi.WaitProcessRequest) (*agentapi.WaitProcessResponse, error) {
	return nil, fmt.Errorf("container %q: %w", r.ContainerId, errdefs.ErrNotFound)
}

func (fakeGuest) Stats(context.Context, *agentapi.StatsRequest) (*agentapi.StatsResponse, error) {
	return nil, fmt.Errorf("stats: %w", errdefs.ErrNotImplemented)
}

func TestClientOverSession(t *testing.T) {
	host, guestEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); guestEnd.Close() })
	go guest.Serve(ctx, fakeGuest{}, guestEnd)

	c := agent.NewClient(host)
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	r, err := c.Ping(cctx, &agentapi.PingRequest{})
	if err != nil || r.BootId != "b" || r.KernelRelease != "k" {
		t.Fatalf("ping = %v, %v", r, err)
	}
	// errdefs errors survive the trip through ttrpc status codes
	if _, err := c.WaitProcess(cctx, &agentapi.WaitProcessRequest{ContainerId: "x"}); !errdefs.IsNotFound(err) {
		t.Fatalf("wait: %v, want errdefs not found", err)
	}
	if _, err := c.Stats(cctx, &agentapi.StatsRequest{}); !errdefs.IsNotImplemented(err) {
		t.Fatalf("stats: %v, want not implemented", err)
	}
	done := c.Done()
	c.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after Close")
	}
	// A call on a lost connection says so: the shim tells a VM that went
	// away from a refusal by it.
	if _, err := c.Ping(cctx, &agentapi.PingRequest{}); !errors.Is(err, ttrpc.ErrClosed) {
		t.Fatalf("ping on a closed connection: %v, want ttrpc.ErrClosed", err)
	}
}
