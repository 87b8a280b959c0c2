package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containerd/log"
)

// Port is the guest's agent port. Read returns (0, io.EOF) (or another error)
// while no host is connected, and blocks for data while one is; Write may block
// while no host is connected.
type Port interface {
	io.Reader
	io.Writer
}

// Listener turns a Port into a net.Listener that yields one connection per host
// epoch (see the package doc); serve it with ttrpc.Server.Serve.
type Listener struct {
	port    Port
	backoff time.Duration
	conns   chan net.Conn
	done    chan struct{}
	once    sync.Once
	wmu     sync.Mutex // serializes writes to the port and epoch switches
}

var _ net.Listener = (*Listener)(nil)

// NewListener starts reading port; backoff is how long to wait after an EOF
// before reading again (the port returns EOF at once while no host is there).
func NewListener(ctx context.Context, port Port, backoff time.Duration) *Listener {
	l := &Listener{port: port, backoff: backoff, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.readLoop(ctx)
	return l
}

func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; the reader goroutine ends at its next read.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *Listener) Addr() net.Addr { return portAddr{} }

var errDisconnected = errors.New("host disconnected")

// portReader turns every read error (EOF: no host) into errDisconnected, so
// that bufio hands it out exactly once per disconnect.
type portReader struct{ p Port }

func (r portReader) Read(b []byte) (int, error) {
	n, err := r.p.Read(b)
	if n > 0 {
		return n, nil
	}
	if err == nil || err == io.EOF {
		return 0, errDisconnected
	}
	return 0, errors.Join(errDisconnected, err)
}

// helloError is returned by forward when a new host said hello mid-epoch.
type helloError struct{ n nonce }

func (helloError) Error() string { return "new session hello" }

func (l *Listener) readLoop(ctx context.Context) {
	r := bufio.NewReaderSize(portReader{l.port}, 64<<10)
	var pending *nonce
	for {
		select {
		case <-l.done:
			return
		default:
		}
		if pending == nil {
			n, err := scan(r, helloMarker, nil)
			if err != nil {
				l.sleep()
				continue
			}
			pending = &n
		}
		ep, ok := l.startEpoch(*pending)
		pending = nil
		if !ok {
			return
		}
		err := forward(r, ep)
		ep.end()
		var h helloError
		switch {
		case errors.As(err, &h):
			pending = &h.n
		case errors.Is(err, errDisconnected):
			log.G(ctx).Debug("agent session: host disconnected")
			l.sleep()
		default:
			log.G(ctx).WithError(err).Warn("agent session: protocol error, waiting for a new hello")
		}
	}
}

func (l *Listener) sleep() {
	select {
	case <-time.After(l.backoff):
	case <-l.done:
	}
}

// startEpoch acknowledges a hello and hands the new connection to Accept.
func (l *Listener) startEpoch(n nonce) (*epochConn, bool) {
	pr, pw := io.Pipe()
	ep := &epochConn{l: l, pr: pr, pw: pw}
	l.wmu.Lock()
	// A write of the previous epoch may have held wmu until now: its bytes reach
	// the host before the ack, and the host drops them.
	err := writeAll(l.port, message(ackMarker, n))
	l.wmu.Unlock()
	if err != nil {
		ep.end() // the host will retry with a new connection
	}
	select {
	case l.conns <- ep:
		return ep, true
	case <-l.done:
		return nil, false
	}
}

func (l *Listener) write(e *epochConn, b []byte) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if e.isDead() {
		return 0, errClosed
	}
	if err := writeAll(l.port, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func writeAll(w io.Writer, b []byte) error {
	for len(b) > 0 {
		n, err := w.Write(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// forward copies whole ttrpc frames from r into the epoch until a hello, a
// disconnect or a malformed header.
func forward(r *bufio.Reader, ep *epochConn) error {
	// Once the server closed its end, frames are still consumed to stay in sync.
	dst := &stickyWriter{w: ep.pw}
	hdr := make([]byte, frameHeaderLen)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return err
		}
		length := binary.BigEndian.Uint32(hdr[:4])
		if length == 0xffffffff {
			rest := make([]byte, helloLen-frameHeaderLen)
			if _, err := io.ReadFull(r, rest); err != nil {
				return err
			}
			msg := append(hdr[:frameHeaderLen:frameHeaderLen], rest...)
			if !bytes.Equal(msg[:markerLen], helloMarker[:]) {
				return errors.New("bad session marker")
			}
			var n nonce
			copy(n[:], msg[markerLen:])
			return helloError{n}
		}
		if length > maxFrameLen {
			return errors.New("frame too large")
		}
		dst.Write(hdr)
		if _, err := io.CopyN(dst, r, int64(length)); err != nil {
			return err
		}
	}
}

type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(b []byte) (int, error) {
	if s.err == nil {
		_, s.err = s.w.Write(b)
	}
	return len(b), nil
}
