package guest

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestOutputBufferReadWaitsForData(t *testing.T) {
	b := newOutputBuffer(16)
	got := make(chan string, 1)
	go func() {
		d, eof, err := b.Read(context.Background(), 100)
		if err != nil || eof {
			got <- "error"
			return
		}
		got <- string(d)
	}()
	select {
	case s := <-got:
		t.Fatalf("read returned %q before any write", s)
	case <-time.After(20 * time.Millisecond):
	}
	b.Write([]byte("hello"))
	if s := <-got; s != "hello" {
		t.Fatalf("read %q", s)
	}
}

func TestOutputBufferEOFAfterDrain(t *testing.T) {
	b := newOutputBuffer(16)
	b.Write([]byte("abcdef"))
	b.CloseWrite()
	d, eof, _ := b.Read(context.Background(), 4)
	if string(d) != "abcd" || eof {
		t.Fatalf("first read %q eof=%v", d, eof)
	}
	d, eof, _ = b.Read(context.Background(), 4)
	if string(d) != "ef" || !eof {
		t.Fatalf("second read %q eof=%v, want the rest with eof", d, eof)
	}
	d, eof, _ = b.Read(context.Background(), 4)
	if len(d) != 0 || !eof {
		t.Fatalf("read after eof %q eof=%v", d, eof)
	}
	if _, err := b.Write([]byte("x")); err == nil {
		t.Fatal("write after CloseWrite succeeded")
	}
}

func TestOutputBufferBlocksWriterWhenFull(t *testing.T) {
	b := newOutputBuffer(4)
	done := make(chan struct{})
	go func() {
		b.Write([]byte("12345678"))
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("writer did not block on a full buffer")
	case <-time.After(20 * time.Millisecond):
	}
	var all []byte
	for len(all) < 8 {
		d, _, err := b.Read(context.Background(), 3)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, d...)
	}
	<-done
	if string(all) != "12345678" {
		t.Fatalf("read %q", all)
	}
}

func TestOutputBufferReadHonoursContext(t *testing.T) {
	b := newOutputBuffer(4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := b.Read(ctx, 1); err != context.DeadlineExceeded {
		t.Fatalf("read on empty buffer: %v, want deadline exceeded", err)
	}
}

func TestPumpCopiesUntilEOF(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	b := newOutputBuffer(1 << 10)
	go pump(r, b)
	w.Write([]byte("one "))
	w.Write([]byte("two"))
	w.Close()
	var out []byte
	for {
		d, eof, err := b.Read(context.Background(), 100)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d...)
		if eof {
			break
		}
	}
	if string(out) != "one two" {
		t.Fatalf("pumped %q", out)
	}
}
