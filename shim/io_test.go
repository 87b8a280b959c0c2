package shim

import (
	"os"
	"testing"
	"time"
)

func TestWaitRead(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write([]byte("last line\n")); err != nil {
		t.Fatal(err)
	}
	if n := unread(w); n != 10 {
		t.Fatalf("unread = %d, want 10", n)
	}
	pio := &procIO{stdout: w}
	go func() {
		time.Sleep(50 * time.Millisecond)
		buf := make([]byte, 64)
		r.Read(buf)
	}()
	start := time.Now()
	pio.waitRead()
	if d := time.Since(start); d < 40*time.Millisecond || d >= drainTimeout {
		t.Fatalf("waitRead returned after %s: it must wait for the reader, and not for the timeout", d)
	}
	if n := unread(w); n != 0 {
		t.Fatalf("unread after the read = %d", n)
	}
	// nobody reads: bounded by drainTimeout
	w.Write([]byte("x"))
	start = time.Now()
	pio.waitRead()
	if d := time.Since(start); d < drainTimeout || d > drainTimeout+500*time.Millisecond {
		t.Fatalf("waitRead without a reader took %s, want about %s", d, drainTimeout)
	}
}
