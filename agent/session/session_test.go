package session

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

// fakePort stands in for the guest's virtio-serial port: reads return EOF while
// no host is attached; attach swaps the host without an EOF in between (what
// the guest sees when a close and an open arrive together, or after a restore).
type fakePort struct {
	mu   sync.Mutex
	cond *sync.Cond
	cur  net.Conn
	data []byte
	gen  int
}

func newFakePort() *fakePort {
	p := &fakePort{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// attach connects a new host and returns its end.
func (p *fakePort) attach() net.Conn {
	host, guest := net.Pipe()
	p.mu.Lock()
	p.gen++
	gen := p.gen
	p.cur, p.data = guest, nil
	p.mu.Unlock()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := guest.Read(buf)
			p.mu.Lock()
			if p.gen != gen {
				p.mu.Unlock()
				return
			}
			p.data = append(p.data, buf[:n]...)
			if err != nil {
				p.cur = nil // host closed: the guest sees EOF
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return host
}

func (p *fakePort) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.data) == 0 && p.cur != nil {
		p.cond.Wait()
	}
	if len(p.data) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.data)
	p.data = p.data[n:]
	return n, nil
}

func (p *fakePort) Write(b []byte) (int, error) {
	p.mu.Lock()
	c := p.cur
	p.mu.Unlock()
	if c == nil {
		return 0, io.ErrClosedPipe
	}
	return c.Write(b)
}

type pingService struct {
	agentapi.AgentService
	mu    sync.Mutex
	calls int
}

func (s *pingService) Ping(ctx context.Context, _ *agentapi.PingRequest) (*agentapi.PingResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return &agentapi.PingResponse{BootId: "boot"}, nil
}

// WaitProcess blocks until its connection goes away.
func (s *pingService) WaitProcess(ctx context.Context, _ *agentapi.WaitProcessRequest) (*agentapi.WaitProcessResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func serve(t *testing.T, port Port) {
	t.Helper()
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agentapi.RegisterAgentService(srv, &pingService{})
	l := NewListener(context.Background(), port, time.Millisecond)
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close(); l.Close() })
}

func ping(t *testing.T, conn net.Conn) *ttrpc.Client {
	t.Helper()
	c := ttrpc.NewClient(NewHostConn(conn))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := agentapi.NewAgentClient(c).Ping(ctx, &agentapi.PingRequest{})
	if err != nil {
		t.Fatalf("ping: %v", err)
	}
	if resp.BootId != "boot" {
		t.Fatalf("boot id %q", resp.BootId)
	}
	return c
}

func TestReconnectAfterClose(t *testing.T) {
	port := newFakePort()
	serve(t, port)
	for i := 0; i < 3; i++ {
		c := ping(t, port.attach())
		c.Close()
	}
}

func TestReconnectWithoutEOF(t *testing.T) {
	port := newFakePort()
	serve(t, port)
	c1 := ping(t, port.attach())
	// A long poll of the first host is still running in the guest.
	go agentapi.NewAgentClient(c1).WaitProcess(context.Background(), &agentapi.WaitProcessRequest{})
	time.Sleep(20 * time.Millisecond)
	// The second host starts again at stream id 1, which the old ttrpc
	// connection would refuse; the hello starts a new epoch instead.
	c2 := ping(t, port.attach())
	c2.Close()
	c1.Close()
}

func TestHostSkipsStaleBytes(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	go func() {
		hello := make([]byte, helloLen)
		io.ReadFull(guest, hello)
		var n nonce
		copy(n[:], hello[markerLen:])
		stale := message(ackMarker, nonce{1, 2, 3}) // an ack for an older host
		guest.Write(append(append([]byte("stale reply"), stale...), append(message(ackMarker, n), "fresh"...)...))
	}()
	c := NewHostConn(host)
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	if string(b) != "fresh" {
		t.Fatalf("read %q, want %q", b, "fresh")
	}
}

func TestScanOverlappingMarker(t *testing.T) {
	n := nonce{9, 9, 9, 9, 9, 9, 9, 9}
	in := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, message(helloMarker, n)...)
	r := bufioReader(in)
	got, err := scan(r, helloMarker, nil)
	if err != nil || got != n {
		t.Fatalf("scan = %v, %v", got, err)
	}
}
