package shim

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/fifo"
)

// pipeOutput is an output on the write end of an os.Pipe that a write has
// already opened.
func pipeOutput(t *testing.T) (*os.File, *output) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	o := &output{WriteCloser: w}
	o.opened.Store(true)
	return r, o
}

func TestDrainWaitsForReader(t *testing.T) {
	r, o := pipeOutput(t)
	if _, err := o.Write([]byte("last line\n")); err != nil {
		t.Fatal(err)
	}
	if n := unread(o); n != 10 {
		t.Fatalf("unread = %d, want 10", n)
	}
	pio := &procIO{stdout: o}
	go func() {
		time.Sleep(50 * time.Millisecond)
		buf := make([]byte, 64)
		r.Read(buf)
	}()
	start := time.Now()
	pio.drain()
	if d := time.Since(start); d < 40*time.Millisecond || d >= drainIdle {
		t.Fatalf("drain returned after %s: it must wait for the reader, and not for the timeout", d)
	}
	if n := unread(o); n != 0 {
		t.Fatalf("unread after the read = %d", n)
	}
	// nobody reads: bounded by drainIdle
	o.Write([]byte("x"))
	start = time.Now()
	pio.drain()
	if d := time.Since(start); d < drainIdle || d > drainIdle+300*time.Millisecond {
		t.Fatalf("drain without a reader took %s, want about %s", d, drainIdle)
	}
}

// chunkGuest is a guest process that printed chunks and exited.
type chunkGuest struct{ chunks chan []byte }

func newChunkGuest(chunks ...[]byte) *chunkGuest {
	g := &chunkGuest{chunks: make(chan []byte, len(chunks))}
	for _, c := range chunks {
		g.chunks <- c
	}
	close(g.chunks)
	return g
}

func (g *chunkGuest) ReadStdio(ctx context.Context, _, _ string, stderr bool) ([]byte, error) {
	if stderr {
		return nil, io.EOF
	}
	b, ok := <-g.chunks
	if !ok {
		return nil, io.EOF
	}
	return b, nil
}
func (g *chunkGuest) WriteStdin(context.Context, string, string, []byte) error { return nil }
func (g *chunkGuest) CloseStdin(context.Context, string, string) error         { return nil }

// exitIO runs what waitExit does with a process's streams and fails the
// test unless it ends within bound: the drain, the close, and the end of
// every copy.
func exitIO(t *testing.T, pio *procIO, bound time.Duration) {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		pio.drain()
		pio.close()
		pio.copies.Wait()
		close(done)
	}()
	select {
	case <-done:
		t.Logf("drain + close took %s", time.Since(start))
	case <-time.After(bound):
		t.Fatalf("drain and close of the process's streams did not end within %s", bound)
	}
}

func TestDrainFIFOStates(t *testing.T) {
	big := make([]byte, 256<<10) // more than a pipe holds
	for _, tc := range []struct {
		name   string
		reader func(t *testing.T, path string) // what containerd's side does
	}{
		{"never opened", func(*testing.T, string) {}},
		{"reader gone before", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}},
		{"reader gone after open", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			go func() { time.Sleep(20 * time.Millisecond); f.Close() }()
		}},
		{"full, never read", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "stdout")
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			tc.reader(t, path)
			o, err := openOutput(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			pio := &procIO{stdout: o}
			pio.start(context.Background(), newChunkGuest([]byte("hello\n"), big), "c", "")
			exitIO(t, pio, drainIdle+time.Second)
		})
	}
}

// An output that was never opened must not be asked for its unread bytes:
// the FIFO library waits for the open before it answers.
func TestUnreadOfUnopenedFIFOIsNotAsked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := openOutput(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.opened.Load() {
		t.Fatal("an output whose reader never came counts as opened")
	}
	pio := &procIO{stdout: o}
	done := make(chan struct{})
	go func() { pio.drain(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("drain blocked on a FIFO that was never opened")
	}
}

func TestCopyOutDeliversAll(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "stdout")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(f)
		f.Close()
		got <- b
	}()
	o, err := openOutput(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 200<<10)
	for i := range want {
		want[i] = byte(i)
	}
	pio := &procIO{stdout: o}
	pio.start(context.Background(), newChunkGuest(want[:1000], want[1000:]), "c", "")
	exitIO(t, pio, drainMax)
	b := <-got
	if len(b) != len(want) || string(b) != string(want) {
		t.Fatalf("reader got %d bytes, want %d", len(b), len(want))
	}
}

// slowStdinGuest takes each stdin chunk after a guest round trip's delay.
type slowStdinGuest struct {
	mu     sync.Mutex
	got    int
	closed chan struct{}
}

func (g *slowStdinGuest) ReadStdio(context.Context, string, string, bool) ([]byte, error) {
	return nil, io.EOF
}

func (g *slowStdinGuest) WriteStdin(_ context.Context, _, _ string, b []byte) error {
	time.Sleep(5 * time.Millisecond)
	g.mu.Lock()
	g.got += len(b)
	g.mu.Unlock()
	return nil
}

func (g *slowStdinGuest) CloseStdin(context.Context, string, string) error {
	close(g.closed)
	return nil
}

// TestCloseIOKeepsWrittenStdin: what CRI's exec and ctr do at the end of
// their input (close the FIFO's writer, then CloseIO at once) delivers
// every byte to the guest before its stdin closes, as under runc, however
// much the pipe still held.
func TestCloseIOKeepsWrittenStdin(t *testing.T) {
	for _, size := range []int{3, 200 << 10} {
		path := filepath.Join(t.TempDir(), "stdin")
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
		pio, err := openIO(context.Background(), stdio{Stdin: path})
		if err != nil {
			t.Fatal(err)
		}
		g := &slowStdinGuest{closed: make(chan struct{})}
		pio.start(context.Background(), g, "c", "e")
		w, err := fifo.OpenFifo(context.Background(), path, syscall.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		w.Close()
		pio.closeStdin()
		select {
		case <-g.closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d bytes: the guest's stdin not closed 10 s after CloseIO", size)
		}
		g.mu.Lock()
		if g.got != size {
			t.Errorf("sent %d bytes, then CloseIO: the guest got %d", size, g.got)
		}
		g.mu.Unlock()
		pio.close()
	}
}
