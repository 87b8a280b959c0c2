// Package agent is the host side of the host<->guest API: a client for the
// cryo-agent running as PID 1 in each sandbox VM. The API itself is in
// agent/api/v1 (agent.proto); the guest implementation is agent/guest.
package agent

import (
	"context"
	"net"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/agent/session"
)

// Client calls the guest agent. All agentapi.AgentService methods are
// available on it; errors come back as errdefs errors (errdefs.IsNotFound,
// ...). Long polls (WaitProcess, ReadStdio) block until the guest has
// something, so give them their own goroutine and context.
type Client struct {
	agentapi.AgentService
	c *ttrpc.Client
}

// NewClient starts a new session on conn, the host's connection to the VM's
// agent port (QEMU's chardev unix socket), and returns a client on it. Every
// new connection, after a restore too, must go through NewClient: it tells the
// guest to drop the previous session (see package session).
func NewClient(conn net.Conn) *Client {
	c := ttrpc.NewClient(session.NewHostConn(conn), ttrpc.WithUnaryClientInterceptor(errorInterceptor))
	return &Client{AgentService: agentapi.NewAgentClient(c), c: c}
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.c.Close() }

// Done is closed when the connection is gone (closed, or the VM went away).
func (c *Client) Done() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		c.c.UserOnCloseWait(context.Background())
		close(ch)
	}()
	return ch
}

// errorInterceptor turns the guest's error status back into errdefs errors
// (ttrpc would otherwise return a plain gRPC status error after this). The
// connection's own errors (ttrpc.ErrClosed when the VM went away, the
// context's) stay as they are: callers tell a lost guest from a refusal by
// them, and errgrpc would make them "unknown".
func errorInterceptor(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoker ttrpc.Invoker) error {
	if err := invoker(ctx, req, resp); err != nil {
		if _, fromGuest := status.FromError(err); !fromGuest {
			return err
		}
		return errgrpc.ToNative(err)
	}
	if resp.Status != nil && resp.Status.Code != int32(codes.OK) {
		return errgrpc.ToNative(status.ErrorProto(resp.Status))
	}
	return nil
}
