package nodecache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/bootid"
	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/stores"
)

// Slot is the node's one materialization in progress of one snapshot
// (a flock per snapshot, from any process): concurrent restores of it
// download it once, the others find the directory complete.
//
// Nothing is fsynced: the directory is a cache that has to survive process
// crashes, which the page cache does. A machine crash may tear it, so a
// completion marker names the boot it was written in (the last file written
// before the rename); a directory whose marker is missing or names another
// boot is removed and materialized again.
type Slot struct {
	s      *Snapshots
	d      digest.Digest
	lock   *os.File
	marker []byte
}

// CompleteFile is the completion marker inside a materialized directory;
// no file of a snapshot may have this name.
const CompleteFile = ".cryo-complete"

// Lock waits (until ctx is done) for the right to materialize the snapshot
// with manifest digest d. Close the slot when done.
func (s *Snapshots) Lock(ctx context.Context, d digest.Digest) (*Slot, error) {
	return s.LockFor(ctx, d, "")
}

// LockFor is Lock for a materialization from the store store (a StoreID;
// "" for any): the lock is per snapshot and store, so a slow store holds up
// only the materializations from itself. Materializations from different
// stores may run at once; the first to publish wins (Publish).
func (s *Snapshots) LockFor(ctx context.Context, d digest.Digest, store string) (*Slot, error) {
	if err := stores.CheckDigest(d); err != nil {
		return nil, err
	}
	if store != "" && !validStoreID(store) {
		return nil, fmt.Errorf("materialize %s: store id %q: %w", d, store, errdefs.ErrInvalidArgument)
	}
	boot, err := bootid.Get()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	lock, err := lockFile(ctx, s.lockPath(d, store), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	marker := fmt.Appendf(nil, "cryo materialized\nmanifest %s\nboot %s\n", d, boot)
	return &Slot{s: s, d: d, lock: lock, marker: marker}, nil
}

// Close releases the slot. Nothing is left behind: a waiter holding the
// removed lock file finds it gone and takes a new one (lockFile).
func (sl *Slot) Close() {
	os.Remove(sl.lock.Name())
	sl.lock.Close()
}

// Path is the snapshot's directory.
func (sl *Slot) Path() string { return sl.s.Path(sl.d) }

// Complete reports whether the directory is complete (this snapshot, this
// boot). A directory of an earlier boot, or one without a marker, goes now:
// its space may be needed.
func (sl *Slot) Complete(ctx context.Context) (bool, error) {
	if isComplete(sl.Path(), sl.marker) {
		return true, nil
	}
	if _, err := os.Lstat(sl.Path()); err != nil {
		return false, nil
	}
	return sl.publish(ctx, "")
}

// TempDir makes an empty directory beside the snapshot's to materialize
// into; Publish renames it into place, Prune removes it if a crash left it.
func (sl *Slot) TempDir() (string, error) {
	return os.MkdirTemp(sl.s.dir, ".tmp-"+sl.d.Encoded()[:16]+"-")
}

// Publish writes the completion marker into tmp (a TempDir holding the
// complete materialization) and renames it into place. hit reports that a
// complete directory was already there (one an older cryo made, which
// locked the snapshot another way): tmp was left alone, remove it.
func (sl *Slot) Publish(ctx context.Context, tmp string) (hit bool, _ error) {
	if err := os.WriteFile(filepath.Join(tmp, CompleteFile), sl.marker, 0o400); err != nil {
		return false, err
	}
	return sl.publish(ctx, tmp)
}

// publish changes the directory under a lock on the snapshots directory
// (held only for renames and removals, so that a check and the change it
// decides are one step for every materialization of every process): if it
// is complete it reports a hit; else it removes whatever it is (an earlier
// boot's directory, one without a marker) and renames tmp, if set, into its
// place.
func (sl *Slot) publish(ctx context.Context, tmp string) (hit bool, _ error) {
	unlock, err := lockDir(ctx, sl.s.dir)
	if err != nil {
		return false, err
	}
	defer unlock()
	final := sl.Path()
	if isComplete(final, sl.marker) {
		return true, nil
	}
	if _, err := os.Lstat(final); err == nil {
		if err := removeDir(sl.s.dir, final); err != nil {
			return false, err
		}
		log.G(ctx).WithField("dir", final).Info("materialize: removed a directory of an earlier boot or without a completion marker")
	}
	if tmp == "" {
		return false, nil
	}
	return false, os.Rename(tmp, final)
}

// isComplete reports whether dir is a directory whose completion marker is
// marker (this snapshot, this boot).
func isComplete(dir string, marker []byte) bool {
	parent, err := safefs.OpenDir(filepath.Dir(dir))
	if err != nil {
		return false
	}
	defer parent.Close()
	d, err := parent.Sub(filepath.Base(dir)) // not a symlink
	if err != nil {
		return false
	}
	defer d.Close()
	b, err := d.ReadFile(CompleteFile, int64(len(marker)))
	return err == nil && bytes.Equal(b, marker)
}

// removeDir moves dir out of the way (a crash while removing it leaves a
// .tmp- directory, which PruneTemp removes) and removes it.
func removeDir(cacheDir, dir string) error {
	// os.Rename refuses an existing target directory, even an empty one.
	trash := filepath.Join(cacheDir, fmt.Sprintf(".tmp-stale-%016x", rand.Uint64()))
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return os.RemoveAll(trash)
}

// lockDir takes an exclusive flock on dir, waiting until ctx is done.
func lockDir(ctx context.Context, dir string) (unlock func(), _ error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := flock.Wait(ctx, d, unix.LOCK_EX); err != nil {
		d.Close()
		return nil, err
	}
	return func() { d.Close() }, nil // closing releases the lock
}

// PruneTemp removes the temporary directories that materializations
// interrupted by a crash left, when older than olderThan (pick more than
// the longest materialization, e.g. an hour).
func (s *Snapshots) PruneTemp(olderThan time.Duration) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("prune %s: %w", s.dir, err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > olderThan {
			errs = append(errs, os.RemoveAll(filepath.Join(s.dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
