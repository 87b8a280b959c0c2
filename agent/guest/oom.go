package guest

import (
	"context"
	"errors"
	"sync"

	"github.com/containerd/log"
)

// errOOMGone ends a wait for OOM kills of a container that was removed.
var errOOMGone = errors.New("the container was removed")

// oomCount is a container's count of OOM kills, as its cgroup's
// memory.events says, for the host to publish each (containerd's TaskOOM,
// which runc's shim sends from the same file).
type oomCount struct {
	mu      sync.Mutex
	n       uint64
	gone    bool
	changed chan struct{} // closed when n grows or the container goes
}

func newOOMCount() *oomCount { return &oomCount{changed: make(chan struct{})} }

// set records n kills, waking the waiters when it is more than before.
func (o *oomCount) set(n uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gone || n <= o.n {
		return
	}
	o.n = n
	close(o.changed)
	o.changed = make(chan struct{})
}

// end wakes the waiters for good: the container is removed.
func (o *oomCount) end() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.gone {
		o.gone = true
		close(o.changed)
	}
}

// wait returns the count once it is more than seen.
func (o *oomCount) wait(ctx context.Context, seen uint64) (uint64, error) {
	for {
		o.mu.Lock()
		n, gone, changed := o.n, o.gone, o.changed
		o.mu.Unlock()
		switch {
		case n > seen:
			return n, nil
		case gone:
			return 0, errOOMGone
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-changed:
		}
	}
}

// watchOOM feeds c.oom from the cgroup's memory.events (inotify, no
// polling: an idle sandbox stays idle) until the cgroup empties or goes.
func (c *container) watchOOM() {
	events, errs := c.cg.EventChan()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return
			}
			c.oom.set(e.OOMKill)
		case err, ok := <-errs:
			if ok && err != nil {
				log.L.WithError(err).WithField("id", c.id).Debug("watch the container's OOM kills")
			}
			return
		}
	}
}
