package servedram

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// blockingReader is a page reader whose reads wait for release, honouring
// ctx or not.
type blockingReader struct {
	release   chan struct{}
	honourCtx bool
}

func (b *blockingReader) Size() int64  { return 1 << 20 }
func (b *blockingReader) Name() string { return "ram" }
func (b *blockingReader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if b.honourCtx {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-b.release:
		}
	} else {
		<-b.release
	}
	return 0, errors.New("released")
}

// TestPageSourceDeadline: a page read that outlives its deadline fails
// (pagefs answers EIO), kills QEMU at once and is kept for the task's exit;
// every later read fails at once, without waiting on the store. A read
// stuck beyond the grace period (a store that ignores cancellation) kills
// QEMU too.
func TestPageSourceDeadline(t *testing.T) {
	r := &RAM{store: "s3://bucket/x"}
	killed := make(chan struct{})
	r.SetKill(func() { close(killed) })

	br := &blockingReader{release: make(chan struct{}), honourCtx: true}
	defer close(br.release)
	s := r.source(br, 20*time.Millisecond, time.Hour)
	start := time.Now()
	if _, err := s.ReadAt(make([]byte, 4096), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the deadline took %v", d)
	}
	if err := r.Err(); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("kept error %v", err)
	}
	select {
	case <-killed:
	default:
		t.Fatal("a failed page did not kill qemu at once")
	}
	// The kernel retries page by page: no retry may wait on the store.
	s.timeout = time.Hour
	start = time.Now()
	for off := int64(0); off < 1<<20; off += 4096 {
		if _, err := s.ReadAt(make([]byte, 4096), off); err == nil {
			t.Fatal("a read after the failure succeeded")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("reads after the failure took %v", d)
	}

	r = &RAM{store: "s3://bucket/x"}
	killed = make(chan struct{})
	r.SetKill(func() { close(killed) })
	stuck := &blockingReader{release: make(chan struct{})}
	defer close(stuck.release)
	s = r.source(stuck, 10*time.Millisecond, 20*time.Millisecond)
	go s.ReadAt(make([]byte, 4096), 0)
	select {
	case <-killed:
	case <-time.After(5 * time.Second):
		t.Fatal("a read stuck beyond its deadline did not kill qemu")
	}
}

// TestCleanup: what a dead shim's served sandbox left (its record and
// RAM layer) goes; a record that names anything but a layer is refused and
// nothing is removed; no record is no work.
func TestCleanup(t *testing.T) {
	dir := t.TempDir()
	if err := Cleanup(dir); err != nil {
		t.Fatalf("nothing served: %v", err)
	}
	layer := filepath.Join(dir, "cryo-0123.layer")
	os.WriteFile(layer, []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, servedRecord), []byte(layer), 0o600)
	if err := Cleanup(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("layer left: %v", err)
	}
	victim := filepath.Join(dir, "precious")
	os.WriteFile(victim, []byte("x"), 0o600)
	for _, bad := range []string{victim, "relative/cryo-1.layer", dir + "/../cryo-1.layer"} {
		os.WriteFile(filepath.Join(dir, servedRecord), []byte(bad), 0o600)
		if err := Cleanup(dir); err == nil {
			t.Errorf("record naming %q accepted", bad)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("a bad record removed %s: %v", victim, err)
	}
}
