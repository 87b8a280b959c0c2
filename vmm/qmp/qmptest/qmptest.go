// Package qmptest runs a fake QMP server on a socketpair so that code using
// package qmp can be tested without QEMU (modelled on go-qemu's qmptest).
package qmptest

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/vmm/qmp"
)

// Request is one command received by the fake server.
type Request struct {
	Execute   string
	Arguments json.RawMessage
	Files     []*os.File // descriptors passed with the command (SCM_RIGHTS); the handler owns them
}

// Handler answers a request: a return value, or a *qmp.Error.
type Handler func(req Request) (any, *qmp.Error)

// Server is a fake QMP server.
type Server struct {
	t    testing.TB
	conn *net.UnixConn

	mu   sync.Mutex
	reqs []Request
}

// NewClient starts a fake server answering with h and returns a client
// connected to it. Both are closed when the test ends.
func NewClient(t testing.TB, h Handler) (*qmp.Client, *Server) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cli, srv := fileConn(t, fds[0]), fileConn(t, fds[1])
	s := &Server{t: t, conn: srv}
	go s.serve(h)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qmp.NewClient(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c, s
}

func fileConn(t testing.TB, fd int) *net.UnixConn {
	f := os.NewFile(uintptr(fd), "qmptest")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}

// Requests returns the commands received so far (qmp_capabilities excluded).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Commands returns the names of the commands received so far.
func (s *Server) Commands() []string {
	var names []string
	for _, r := range s.Requests() {
		names = append(names, r.Execute)
	}
	return names
}

// Event sends an asynchronous event to the client.
func (s *Server) Event(name string, data any) {
	s.send(map[string]any{"event": name, "data": data,
		"timestamp": map[string]int64{"seconds": time.Now().Unix(), "microseconds": 0}})
}

// Close closes the server's end, as a dying QEMU would.
func (s *Server) Close() { s.conn.Close() }

func (s *Server) send(v any) {
	b, _ := json.Marshal(v)
	s.conn.Write(append(b, '\n'))
}

func (s *Server) serve(h Handler) {
	s.send(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 0}, "package": "qmptest"},
		"capabilities": []string{},
	}})
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(16*4))
	var pending []byte
	var files []*os.File
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					files = append(files, os.NewFile(uintptr(fd), "passed"))
				}
			}
		}
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			var req struct {
				Execute   string          `json:"execute"`
				Arguments json.RawMessage `json:"arguments"`
				ID        json.RawMessage `json:"id"`
			}
			json.Unmarshal(pending[:i], &req)
			pending = pending[i+1:]
			r := Request{Execute: req.Execute, Arguments: req.Arguments, Files: files}
			files = nil
			if r.Execute == "qmp_capabilities" {
				s.send(map[string]any{"return": struct{}{}, "id": req.ID})
				continue
			}
			s.mu.Lock()
			s.reqs = append(s.reqs, r)
			s.mu.Unlock()
			ret, qerr := h(r)
			if qerr != nil {
				s.send(map[string]any{"error": qerr, "id": req.ID})
				continue
			}
			if ret == nil {
				ret = struct{}{}
			}
			s.send(map[string]any{"return": ret, "id": req.ID})
		}
	}
}
