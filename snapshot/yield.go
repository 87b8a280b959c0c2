package snapshot

import (
	"context"
	"runtime"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// YieldNice is the niceness of a yielding write's workers (WriteOptions.Yield).
const YieldNice = 10

// yielding caps a yielding write's workers so that one of procs
// processors stays with goroutines at the normal priority; with one
// processor the write does not yield.
func yielding(workers int, yield bool, procs int) (int, bool) {
	if !yield || procs <= 1 {
		return workers, false
	}
	return min(workers, procs-1), true
}

// yield lowers the calling worker's thread to YieldNice when the write
// yields. The goroutine keeps the thread to its end and never unlocks it,
// so the Go runtime ends the thread with it instead of handing a lowered
// thread to other goroutines.
func (w *writer) yield(ctx context.Context) {
	if !w.opts.Yield {
		return
	}
	runtime.LockOSThread()
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), YieldNice); err != nil {
		log.G(ctx).WithError(err).Debug("snapshot write: lower worker priority")
	}
}
