package guest

import (
	"context"
	"io"
	"os"
	"sync"
)

// defaultOutputLimit bounds what the agent buffers per stream until the host
// reads it; the writing process blocks when it is full.
const defaultOutputLimit = 1 << 20

// outputBuffer holds one output stream of a process between the pipe (or pty)
// and the host's ReadStdio long polls.
type outputBuffer struct {
	mu      sync.Mutex
	data    []byte
	limit   int
	eof     bool
	changed chan struct{} // closed and replaced on every change
}

func newOutputBuffer(limit int) *outputBuffer {
	return &outputBuffer{limit: limit, changed: make(chan struct{})}
}

func (b *outputBuffer) signalLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Write appends p, blocking while the buffer is full.
func (b *outputBuffer) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		b.mu.Lock()
		if b.eof {
			b.mu.Unlock()
			return written, io.ErrClosedPipe
		}
		room := b.limit - len(b.data)
		if room <= 0 {
			ch := b.changed
			b.mu.Unlock()
			<-ch
			continue
		}
		n := min(room, len(p))
		b.data = append(b.data, p[:n]...)
		b.signalLocked()
		b.mu.Unlock()
		p, written = p[n:], written+n
	}
	return written, nil
}

// CloseWrite marks the end of the stream; readers get eof after the rest.
func (b *outputBuffer) CloseWrite() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.eof {
		b.eof = true
		b.signalLocked()
	}
}

// Read waits until data is buffered or the stream ended, and returns at most
// max bytes; eof is true once the stream ended and nothing is left.
func (b *outputBuffer) Read(ctx context.Context, max int) ([]byte, bool, error) {
	for {
		b.mu.Lock()
		if len(b.data) > 0 {
			n := min(max, len(b.data))
			out := append([]byte(nil), b.data[:n]...)
			b.data = b.data[n:]
			if len(b.data) == 0 {
				b.data = nil // let the array go
			}
			b.signalLocked()
			eof := b.eof && len(b.data) == 0
			b.mu.Unlock()
			return out, eof, nil
		}
		if b.eof {
			b.mu.Unlock()
			return nil, true, nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// pump copies r into b until EOF (or EIO: a pty whose other side is gone),
// then closes both.
func pump(r *os.File, b *outputBuffer) {
	defer r.Close()
	defer b.CloseWrite()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := b.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// io.EOF from a pipe, EIO from a pty master once the terminal is
			// closed: both end the stream.
			return
		}
	}
}
