package shim

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/containerd/log"
)

// A shim serves one sandbox for its whole life, and most sandboxes idle.
// Go gives freed heap back to the kernel slowly, and the buffers pooled in
// sync.Pools (go-fuse's request buffers, the snapshot's decode buffers:
// some 25 MiB after a lazy restore) are freed only by the second GC after
// their last use, which a shim that allocates nothing does not run for
// minutes. So the shim trims itself: when it has allocated since the last
// trim, two GCs (the pools' victim caches go with the second) and the heap's
// free pages returned. An idle shim allocates nothing, so it trims once
// and then costs nothing.

// trimEvery is how often the shim looks; trimAfter is how much it must
// have allocated since the last trim for another.
const (
	trimEvery = 30 * time.Second
	trimAfter = 1 << 20
)

// trimMemory trims the shim's memory every trimEvery until ctx ends.
func trimMemory(ctx context.Context) {
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	last := allocated()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if allocated()-last < trimAfter {
			continue
		}
		trim(ctx)
		last = allocated()
	}
}

// trim runs two GCs and returns the free heap to the kernel.
func trim(ctx context.Context) {
	start := time.Now()
	runtime.GC()
	debug.FreeOSMemory()
	log.G(ctx).WithFields(log.Fields{"duration": time.Since(start), "heap_bytes": heapBytes()}).Debug("shim memory trimmed")
}

// allocated is the bytes allocated on the heap since the process started.
func allocated() uint64 { return readMetric("/gc/heap/allocs:bytes") }

// heapBytes is the heap's live and not yet swept objects, in bytes.
func heapBytes() uint64 { return readMetric("/memory/classes/heap/objects:bytes") }

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
