package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	holder, waiter := open(), open()
	if err := Wait(context.Background(), holder, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	// busy: gives up with the context
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := Wait(ctx, waiter, unix.LOCK_EX); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a held lock = %v, want the deadline", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Wait gave up after %s", d)
	}
	// released: taken
	go func() { time.Sleep(20 * time.Millisecond); Unlock(holder) }()
	if err := Wait(context.Background(), waiter, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}
