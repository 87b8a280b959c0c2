package snapshot

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"
)

// TestYielding: a yielding write leaves one processor to the rest of the
// process, and does not yield on one.
func TestYielding(t *testing.T) {
	for _, c := range []struct {
		workers, procs int
		yield          bool
		want           int
		wantYield      bool
	}{
		{workers: 2, procs: 2, yield: false, want: 2},
		{workers: 2, procs: 2, yield: true, want: 1, wantYield: true},
		{workers: 1, procs: 8, yield: true, want: 1, wantYield: true},
		{workers: 8, procs: 8, yield: true, want: 7, wantYield: true},
		{workers: 1, procs: 1, yield: true, want: 1},
	} {
		w, y := yielding(c.workers, c.yield, c.procs)
		if w != c.want || y != c.wantYield {
			t.Errorf("yielding(%d, %v, %d) = %d, %v; want %d, %v", c.workers, c.yield, c.procs, w, y, c.want, c.wantYield)
		}
	}
}

// TestYieldLowersOnlyTheWorker: a yielding worker's thread runs at
// YieldNice and ends with it; the caller's thread keeps its priority.
func TestYieldLowersOnlyTheWorker(t *testing.T) {
	nice := func() int {
		// The raw syscall returns 20 - nice.
		p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
		if err != nil {
			t.Fatal(err)
		}
		return 20 - p
	}
	before := nice()
	w := &writer{opts: WriteOptions{Yield: true}}
	got := make(chan int)
	go func() {
		w.yield(context.Background())
		got <- nice()
	}()
	if n := <-got; n != YieldNice {
		t.Errorf("worker nice %d, want %d", n, YieldNice)
	}
	if n := nice(); n != before {
		t.Errorf("caller nice %d, was %d", n, before)
	}
	off := &writer{}
	go func() {
		off.yield(context.Background())
		got <- nice()
	}()
	if n := <-got; n != before {
		t.Errorf("worker of a write that does not yield: nice %d, want %d", n, before)
	}
}
