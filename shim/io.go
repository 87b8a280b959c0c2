package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// stdioGuest is what process I/O needs from the guest agent.
type stdioGuest interface {
	// readStdio blocks until output is available; it returns io.EOF once the
	// stream is closed and drained.
	readStdio(ctx context.Context, containerID, execID string, stderr bool) ([]byte, error)
	writeStdin(ctx context.Context, containerID, execID string, data []byte) error
	closeStdin(ctx context.Context, containerID, execID string) error
}

// procIO copies a guest process's streams to and from what containerd gave
// the task: FIFOs (ctr, CRI) or file:// URIs.
type procIO struct {
	stdin  io.ReadCloser
	stdout io.WriteCloser
	stderr io.WriteCloser
	copies sync.WaitGroup
	closer sync.Once
}

// openIO opens containerd's side of the streams. FIFOs are opened
// non-blocking for writing so that a client that went away cannot hang the
// shim.
func openIO(ctx context.Context, s stdio) (_ *procIO, retErr error) {
	pio := &procIO{}
	defer func() {
		if retErr != nil {
			pio.close()
		}
	}()
	var err error
	if s.stdin != "" {
		if pio.stdin, err = fifo.OpenFifo(context.WithoutCancel(ctx), s.stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return nil, fmt.Errorf("open stdin %s: %w", s.stdin, err)
		}
	}
	if pio.stdout, err = openOutput(ctx, s.stdout); err != nil {
		return nil, err
	}
	if !s.terminal {
		if pio.stderr, err = openOutput(ctx, s.stderr); err != nil {
			return nil, err
		}
	}
	return pio, nil
}

func openOutput(ctx context.Context, uri string) (io.WriteCloser, error) {
	if uri == "" {
		return nil, nil
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("stdio uri %q: %w", uri, err)
	}
	switch u.Scheme {
	case "", "fifo":
		path := uri
		if u.Scheme != "" {
			path = u.Path
		}
		f, err := fifo.OpenFifo(context.WithoutCancel(ctx), path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open output %s: %w", path, err)
		}
		return f, nil
	case "file":
		f, err := os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, fmt.Errorf("open output %s: %w", u.Path, err)
		}
		return f, nil
	default:
		return nil, fmt.Errorf("stdio uri %q: scheme %q is not supported by cryo (use fifos or file://)", uri, u.Scheme)
	}
}

// start begins copying. Output copies end when the guest reports EOF for the
// stream (the process exited and its output is drained).
func (pio *procIO) start(ctx context.Context, g stdioGuest, containerID, execID string) {
	out := func(w io.WriteCloser, stderr bool) {
		defer pio.copies.Done()
		for {
			b, err := g.readStdio(ctx, containerID, execID, stderr)
			if len(b) > 0 && w != nil {
				if _, werr := w.Write(b); werr != nil {
					log.G(ctx).WithError(werr).Debug("write process output")
					w = nil // the reader went away: keep draining the guest
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && ctx.Err() == nil {
					log.G(ctx).WithError(err).WithField("exec", execID).Debug("read process output")
				}
				return
			}
		}
	}
	pio.copies.Add(1)
	go out(pio.stdout, false)
	if pio.stderr != nil {
		pio.copies.Add(1)
		go out(pio.stderr, true)
	}
	if pio.stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := pio.stdin.Read(buf)
				if n > 0 {
					if werr := g.writeStdin(ctx, containerID, execID, buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = g.closeStdin(ctx, containerID, execID)
					return
				}
			}
		}()
	}
}

// wait waits for the output copies to finish, at most until ctx is done.
func (pio *procIO) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() { pio.copies.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (pio *procIO) closeStdin() {
	if pio.stdin != nil {
		pio.stdin.Close()
	}
}

func (pio *procIO) close() {
	pio.closer.Do(func() {
		for _, c := range []io.Closer{pio.stdin, pio.stdout, pio.stderr} {
			if c != nil {
				c.Close()
			}
		}
	})
}

// drainTimeout bounds how long an exit waits for containerd to read the
// last output out of a FIFO.
const drainTimeout = time.Second

// waitRead waits until the readers of the output FIFOs took what the shim
// wrote (the pipe holds no unread byte), at most drainTimeout. A process
// that prints and exits at once has its output in the pipe microseconds
// before its exit event; containerd's CRI closes its end of the FIFOs when
// it handles the exit, and would drop what it had not read yet.
func (pio *procIO) waitRead() {
	deadline := time.Now().Add(drainTimeout)
	for _, w := range []io.WriteCloser{pio.stdout, pio.stderr} {
		for w != nil && unread(w) > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// unread returns the bytes waiting in the pipe behind w (FIONREAD works on
// either end of a pipe), or 0 when that cannot be told.
func unread(w io.Writer) int {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ) // TIOCINQ is FIONREAD
		if err == nil {
			n = v
		}
	})
	return n
}
