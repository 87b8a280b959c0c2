// Package flock takes advisory file locks (flock(2)) that give up when a
// context is done: a lock held by a stuck or hostile peer (another shim, a
// process on the same NFS store) must not hang the caller.
package flock

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// poll is how often a busy lock is tried again.
const poll = 5 * time.Millisecond

// Wait takes a flock (unix.LOCK_SH or unix.LOCK_EX) on f, trying again
// until ctx is done.
func Wait(ctx context.Context, f *os.File, how int) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock %s: %w", f.Name(), ctx.Err())
		case <-t.C:
		}
	}
}

// Unlock releases f's lock.
func Unlock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_UN) }
