package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// request is what the fake server decodes from the client.
type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
	fds       []int
}

// fakeServer plays QEMU on one end of a socketpair. handle answers each
// request by writing raw lines with send (responses and events alike).
type fakeServer struct {
	t    *testing.T
	conn *net.UnixConn
}

func (s *fakeServer) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.t.Errorf("fake server: marshal: %v", err)
		return
	}
	s.conn.Write(append(b, '\n'))
}

func (s *fakeServer) reply(req request, ret any) {
	s.send(map[string]any{"return": ret, "id": req.ID})
}

// socketpair returns two connected unix stream sockets.
func socketpair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// startFake starts a fake QMP server that greets (unless greet is false),
// accepts qmp_capabilities and passes every other request to handle.
func startFake(t *testing.T, greet bool, handle func(s *fakeServer, req request)) *net.UnixConn {
	t.Helper()
	cli, srv := socketpair(t)
	s := &fakeServer{t: t, conn: srv}
	t.Cleanup(func() { srv.Close() })
	go func() {
		if greet {
			s.send(map[string]any{"QMP": map[string]any{
				"version":      map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 19}, "package": "Debian 1:7.2+dfsg-7"},
				"capabilities": []string{"oob"},
			}})
		}
		buf := make([]byte, 64*1024)
		oob := make([]byte, unix.CmsgSpace(4*4))
		var pending []byte
		var fds []int
		for {
			n, oobn, _, _, err := srv.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			if oobn > 0 {
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				for _, m := range msgs {
					got, _ := unix.ParseUnixRights(&m)
					fds = append(fds, got...)
				}
			}
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				var req request
				if err := json.Unmarshal(pending[:i], &req); err != nil {
					t.Errorf("fake server: bad request %q: %v", pending[:i], err)
				}
				pending = pending[i+1:]
				req.fds, fds = fds, nil
				if req.Execute == "qmp_capabilities" {
					s.reply(req, struct{}{})
					continue
				}
				handle(s, req)
			}
		}
	}()
	return cli
}

func connect(t *testing.T, handle func(s *fakeServer, req request)) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewClient(ctx, startFake(t, true, handle))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestExecuteAndVersion(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		switch req.Execute {
		case "query-status":
			s.reply(req, map[string]any{"status": "running", "running": true})
		case "echo":
			s.reply(req, req.Arguments)
		}
	})
	if got := c.Version().String(); got != "7.2.19" {
		t.Errorf("version = %q, want 7.2.19", got)
	}
	ctx := context.Background()
	ret, err := c.Execute(ctx, "query-status", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Status string }
	if err := json.Unmarshal(ret, &st); err != nil || st.Status != "running" {
		t.Errorf("query-status = %s (%v), want status running", ret, err)
	}
	ret, err = c.Execute(ctx, "echo", map[string]string{"path": "/a,b"})
	if err != nil {
		t.Fatal(err)
	}
	if string(ret) != `{"path":"/a,b"}` {
		t.Errorf("echo returned %s", ret)
	}
}

func TestErrorClass(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		s.send(map[string]any{"id": req.ID, "error": map[string]string{
			"class": "CommandNotFound", "desc": fmt.Sprintf("The command %s has not been found", req.Execute)}})
	})
	_, err := c.Execute(context.Background(), "nope", nil)
	var qe *Error
	if !errors.As(err, &qe) {
		t.Fatalf("err = %v (%T), want *qmp.Error", err, err)
	}
	if qe.Class != "CommandNotFound" || !strings.Contains(qe.Desc, "nope") {
		t.Errorf("error = %+v", qe)
	}
}

func TestEventsAreSeparatedFromResponses(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		// An event arrives between the command and its response.
		s.send(map[string]any{"event": "STOP", "timestamp": map[string]int64{"seconds": 1700000000, "microseconds": 5}})
		s.send(map[string]any{"event": "DEVICE_DELETED", "data": map[string]string{"device": "disk1"},
			"timestamp": map[string]int64{"seconds": 1700000001, "microseconds": 0}})
		s.reply(req, struct{}{})
	})
	events, cancel := c.Subscribe(8)
	defer cancel()
	ret, err := c.Execute(context.Background(), "stop", nil)
	if err != nil || string(ret) != "{}" {
		t.Fatalf("stop = %s, %v", ret, err)
	}
	var got []string
	for len(got) < 2 {
		select {
		case ev := <-events:
			got = append(got, ev.Name)
			if ev.Name == "DEVICE_DELETED" && !strings.Contains(string(ev.Data), "disk1") {
				t.Errorf("DEVICE_DELETED data = %s", ev.Data)
			}
			if ev.Name == "STOP" && ev.Timestamp.Unix() != 1700000000 {
				t.Errorf("STOP timestamp = %v", ev.Timestamp)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("events received %v, want STOP and DEVICE_DELETED", got)
		}
	}
	if got[0] != "STOP" || got[1] != "DEVICE_DELETED" {
		t.Errorf("events = %v", got)
	}
	cancel()
	if _, ok := <-events; ok {
		t.Error("subscription channel still open after cancel")
	}
}

func TestTimeoutDiscardsLateResponse(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		if req.Execute == "slow" {
			time.Sleep(300 * time.Millisecond)
			s.reply(req, "slow-answer")
			return
		}
		s.reply(req, "fast-answer")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Execute(ctx, "slow", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Errorf("timeout took %v", d)
	}
	// The server answers "slow" first; the client must not hand that to "fast".
	ret, err := c.Execute(context.Background(), "fast", nil)
	if err != nil || string(ret) != `"fast-answer"` {
		t.Errorf("fast = %s, %v; want \"fast-answer\"", ret, err)
	}
}

func TestGreetingTimeout(t *testing.T) {
	conn := startFake(t, false, func(*fakeServer, request) {})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := NewClient(ctx, conn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestDialMissingSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := Dial(ctx, t.TempDir()+"/none.sock"); err == nil {
		t.Fatal("Dial of a missing socket succeeded")
	}
}

func TestExecuteWithFilePassesDescriptor(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		if len(req.fds) != 1 {
			s.send(map[string]any{"id": req.ID, "error": map[string]string{"class": "GenericError", "desc": "No file descriptor supplied via SCM_RIGHTS"}})
			return
		}
		f := os.NewFile(uintptr(req.fds[0]), "passed")
		fmt.Fprintf(f, "written through %s", req.Arguments)
		f.Close()
		s.reply(req, struct{}{})
	})
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if _, err := c.ExecuteWithFile(context.Background(), "getfd", map[string]string{"fdname": "mig"}, pw); err != nil {
		t.Fatal(err)
	}
	pw.Close() // the server closed its duplicate; now the pipe reaches EOF
	b, err := io.ReadAll(bufio.NewReader(pr))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `written through {"fdname":"mig"}` {
		t.Errorf("pipe got %q", b)
	}
	// Without a file, the server sees no descriptor.
	_, err = c.Execute(context.Background(), "getfd", map[string]string{"fdname": "x"})
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "GenericError" {
		t.Errorf("getfd without fd: err = %v", err)
	}
}

func TestPeerCloseFailsPendingAndClosesEvents(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) {
		s.conn.Close() // QEMU died mid-command
	})
	events, _ := c.Subscribe(1)
	_, err := c.Execute(context.Background(), "quit", nil)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after peer closed")
	}
	if _, ok := <-events; ok {
		t.Error("events channel open after close")
	}
	if _, err := c.Execute(context.Background(), "query-status", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("execute after close: %v", err)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	c := connect(t, func(s *fakeServer, req request) { s.reply(req, struct{}{}) })
	if err := c.Close(); err != nil {
		t.Errorf("first Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Execute(context.Background(), "cont", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("execute after Close: %v", err)
	}
}
