package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// stdioGuest is what process I/O needs from the guest agent.
type stdioGuest interface {
	// ReadStdio blocks until output is available; it returns io.EOF once
	// the stream is closed and drained.
	ReadStdio(ctx context.Context, containerID, execID string, stderr bool) ([]byte, error)
	WriteStdin(ctx context.Context, containerID, execID string, data []byte) error
	CloseStdin(ctx context.Context, containerID, execID string) error
}

// procIO copies a guest process's streams to and from what containerd gave
// the task: FIFOs (ctr, CRI) or file:// URIs.
type procIO struct {
	stdin io.ReadCloser
	// stdinW is the shim's own writer of the stdin FIFO, as runc's shim
	// holds one: the process's stdin ends when CloseIO closes it and the
	// client's writer is gone too, after every byte they wrote. Closing
	// the read end instead would drop what the pipe still holds (the
	// client closes its writer and calls CloseIO at once: kubectl cp,
	// exec -i < file).
	stdinW io.Closer
	stdout *output
	stderr *output
	copies sync.WaitGroup
	closer sync.Once
	// noticer writes notice's line once; a second caller waits for it.
	noticer sync.Once
	// moved is when the copies last moved a byte (unix nanos): a drain
	// gives up once nothing moves, whatever the FIFOs' state.
	moved atomic.Int64
}

// output is one of containerd's output streams. A FIFO opened non-blocking
// has no file descriptor until its reader opens it, and anything asked of
// it before (a write, its unread bytes) waits for that reader, for ever if
// the reader went away. opened turns true on the first write that returns,
// after which asking is safe.
type output struct {
	io.WriteCloser
	opened atomic.Bool
}

// openIO opens containerd's side of the streams. FIFOs are opened
// non-blocking so that a client that went away cannot hang the shim: the
// open completes in the background when the reader comes, and close ends it
// when no reader ever does.
func openIO(ctx context.Context, s stdio) (_ *procIO, retErr error) {
	pio := &procIO{}
	defer func() {
		if retErr != nil {
			pio.close()
		}
	}()
	var err error
	if s.Stdin != "" {
		if pio.stdin, err = fifo.OpenFifo(context.WithoutCancel(ctx), s.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return nil, fmt.Errorf("open stdin %s: %w", s.Stdin, err)
		}
		if pio.stdinW, err = fifo.OpenFifo(context.WithoutCancel(ctx), s.Stdin, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err != nil {
			return nil, fmt.Errorf("open stdin %s for writing: %w", s.Stdin, err)
		}
	}
	if pio.stdout, err = openOutput(ctx, s.Stdout); err != nil {
		return nil, err
	}
	if !s.Terminal {
		if pio.stderr, err = openOutput(ctx, s.Stderr); err != nil {
			return nil, err
		}
	}
	return pio, nil
}

func openOutput(ctx context.Context, uri string) (*output, error) {
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
		return &output{WriteCloser: f}, nil
	case "file":
		f, err := os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, fmt.Errorf("open output %s: %w", u.Path, err)
		}
		o := &output{WriteCloser: f}
		o.opened.Store(true)
		return o, nil
	default:
		return nil, fmt.Errorf("stdio uri %q: scheme %q is not supported by cryo (use fifos or file://)", uri, u.Scheme)
	}
}

// start begins copying. Output copies end when the guest reports EOF for the
// stream (the last writer of the process's pipe closed: the process and
// any child it left with the pipe, and its output is drained), or when the
// guest connection closes.
func (pio *procIO) start(ctx context.Context, g stdioGuest, containerID, execID string) {
	pio.touch()
	if pio.stdout != nil {
		pio.copies.Add(1)
		go pio.copyOut(ctx, g, pio.stdout, containerID, execID, false)
	}
	if pio.stderr != nil {
		pio.copies.Add(1)
		go pio.copyOut(ctx, g, pio.stderr, containerID, execID, true)
	}
	if pio.stdin != nil {
		go pio.copyIn(ctx, g, containerID, execID)
	}
}

func (pio *procIO) copyOut(ctx context.Context, g stdioGuest, o *output, containerID, execID string, stderr bool) {
	defer pio.copies.Done()
	dst := o
	for {
		b, err := g.ReadStdio(ctx, containerID, execID, stderr)
		pio.touch()
		if len(b) > 0 && dst != nil {
			if _, werr := dst.Write(b); werr != nil {
				log.G(ctx).WithError(werr).Debug("write process output")
				dst = nil // the reader went away: keep draining the guest
			} else {
				dst.opened.Store(true)
				pio.touch()
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

func (pio *procIO) copyIn(ctx context.Context, g stdioGuest, containerID, execID string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := pio.stdin.Read(buf)
		if n > 0 {
			if werr := g.WriteStdin(ctx, containerID, execID, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = g.CloseStdin(ctx, containerID, execID)
			return
		}
	}
}

func (pio *procIO) touch() { pio.moved.Store(time.Now().UnixNano()) }

// idle returns how long no byte moved, counted from since at the earliest.
func (pio *procIO) idle(since time.Time) time.Duration {
	last := time.Unix(0, pio.moved.Load())
	if last.Before(since) {
		last = since
	}
	return time.Since(last)
}

const (
	// drainIdle ends a drain when no byte moved for this long: the FIFO's
	// reader never came, went away without closing, or stopped reading.
	drainIdle = 500 * time.Millisecond
	// drainMax bounds a drain whose bytes keep moving.
	drainMax = 5 * time.Second
)

// drain waits for the process's last output to reach containerd: the
// copies read the guest's streams to EOF, then the readers of the output
// FIFOs take what is still in the pipes. A process that prints and exits
// at once has its output in the pipe microseconds before its exit event;
// containerd's CRI closes its end of the FIFOs when it handles the exit,
// and would drop what it had not read yet. The wait ends once nothing
// moved for drainIdle, and at drainMax: it never waits on a FIFO that was
// never opened, nor on a reader that stopped reading.
func (pio *procIO) drain() {
	start := time.Now()
	if !pio.waitCopies(start) {
		return
	}
	for _, o := range []*output{pio.stdout, pio.stderr} {
		if o == nil || !o.opened.Load() {
			continue // nothing was written, so nothing waits to be read
		}
		for n := unread(o); n > 0; {
			time.Sleep(5 * time.Millisecond)
			m := unread(o)
			if m < n {
				pio.touch()
			}
			n = m
			if pio.idle(start) > drainIdle || time.Since(start) > drainMax {
				return
			}
		}
	}
}

// waitCopies waits for the output copies to finish; it reports false when
// it gave up.
func (pio *procIO) waitCopies(start time.Time) bool {
	done := make(chan struct{})
	go func() { pio.copies.Wait(); close(done) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return true
		case <-tick.C:
			if pio.idle(start) > drainIdle || time.Since(start) > drainMax {
				return false
			}
		}
	}
}

// noticeWait bounds each half of a notice: the wait for the guest's last
// output, and the write of the line.
const noticeWait = time.Second

// notice writes line as the process's last output, after what the guest
// sent: to stderr, or to stdout for a terminal. It is for what the guest
// cannot say itself (why its VM stopped), and is written once; the streams
// stay open for close.
func (pio *procIO) notice(line string) {
	if pio == nil {
		return
	}
	pio.noticer.Do(func() {
		o := pio.stderr
		if o == nil {
			o = pio.stdout
		}
		if o == nil {
			return
		}
		copied := make(chan struct{})
		go func() { pio.copies.Wait(); close(copied) }()
		select {
		case <-copied:
		case <-time.After(noticeWait):
		}
		written := make(chan struct{})
		go func() {
			defer close(written)
			// A FIFO whose reader never comes blocks this write until
			// close ends it.
			_, _ = o.Write([]byte(line + "\n"))
		}()
		select {
		case <-written:
		case <-time.After(noticeWait):
		}
	})
}

// closeAfterCopies closes the streams once the copies ended: the guest
// reported EOF on every output (or its connection closed).
func (pio *procIO) closeAfterCopies() {
	pio.copies.Wait()
	pio.close()
}

// closeStdin is CloseIO's: the process's stdin ends once what was
// written is read (see stdinW).
func (pio *procIO) closeStdin() {
	if pio.stdinW != nil {
		pio.stdinW.Close()
	}
}

// close closes containerd's side of the streams; a FIFO open still waiting
// for its reader ends, and a copy blocked writing into a full FIFO returns.
func (pio *procIO) close() {
	pio.closer.Do(func() {
		if pio.stdin != nil {
			pio.stdin.Close()
		}
		if pio.stdinW != nil {
			pio.stdinW.Close()
		}
		for _, o := range []*output{pio.stdout, pio.stderr} {
			if o != nil {
				o.Close()
			}
		}
	})
}

// unread returns the bytes waiting in the pipe behind o (FIONREAD works on
// either end of a pipe), or 0 when that cannot be told. Only ask an output
// that is opened: a FIFO still opening answers when its reader comes.
func unread(o *output) int {
	sc, ok := o.WriteCloser.(syscall.Conn)
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
