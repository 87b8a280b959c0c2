package guest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestOOMCount: a wait returns once the count passes what the host has
// seen, at once when it already has, and ends when the container goes;
// a count that does not grow wakes nobody.
func TestOOMCount(t *testing.T) {
	o := newOOMCount()
	got := make(chan uint64, 1)
	go func() {
		n, _ := o.wait(context.Background(), 0)
		got <- n
	}()
	o.set(0)
	select {
	case n := <-got:
		t.Fatalf("a wait returned %d with no kill", n)
	case <-time.After(50 * time.Millisecond):
	}
	o.set(2)
	if n := <-got; n != 2 {
		t.Fatalf("wait = %d, want 2", n)
	}
	if n, err := o.wait(context.Background(), 1); n != 2 || err != nil {
		t.Fatalf("wait past 1 = %d %v, want 2 at once", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := o.wait(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past 2 with no new kill: %v, want the context's end", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := o.wait(context.Background(), 2)
		done <- err
	}()
	o.end()
	o.set(5) // a last event after the removal changes nothing
	if err := <-done; !errors.Is(err, errOOMGone) {
		t.Fatalf("wait when the container goes: %v", err)
	}
}
