package snapshot

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/safefs"
)

// A materialized snapshot is in use while a sandbox restored from it runs:
// its QEMU maps the RAM file, and its disk overlays name the materialized
// disks as backing files. Use marks this with a shared flock on
// <cacheDir>/.<hex>.use, held until release or until the process exits,
// however it exits. PruneMaterialized removes a directory only while it
// holds that lock exclusively. The file's mtime is the last use.

func usePath(cacheDir string, d digest.Digest) string {
	return filepath.Join(cacheDir, "."+d.Encoded()+".use")
}

// materializeLockPath is the lock that makes concurrent Materialize calls
// of one snapshot (from any process) download it once; it exists only
// while one runs.
func materializeLockPath(cacheDir string, d digest.Digest) string {
	return filepath.Join(cacheDir, "."+d.Encoded()+".lock")
}

// Use marks the materialization of the snapshot with manifest digest d
// under cacheDir as in use and records the time. Take it before
// Materialize, so that no prune removes the directory in between, and
// release it when the sandbox is gone.
func Use(ctx context.Context, cacheDir string, d digest.Digest) (release func(), _ error) {
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("use %s: %w", d, err)
	}
	f, err := lockFile(ctx, usePath(cacheDir, d), unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("use %s: %w", d, err)
	}
	now := unix.NsecToTimeval(time.Now().UnixNano())
	if err := unix.Futimes(int(f.Fd()), []unix.Timeval{now, now}); err != nil {
		log.G(ctx).WithError(err).Warn("record the use of a materialized snapshot")
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// lockFile opens (creating) path and takes a flock on it, waiting until ctx
// is done. A prune may remove the file between the open and the lock, so
// the lock counts only if path still names the locked file.
func lockFile(ctx context.Context, path string, how int) (*os.File, error) {
	for {
		f, err := openInDir(path, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, err
		}
		if err := flock.Wait(ctx, f, how); err != nil {
			f.Close()
			return nil, err
		}
		if sameFile(f, path) {
			return f, nil
		}
		f.Close()
	}
}

// openInDir opens (flag as os.OpenFile, creating 0600) the regular file
// at path, a name in a directory of the node's: a symlink, FIFO or device
// planted there is refused, never followed or waited on.
func openInDir(path string, flag int) (*os.File, error) {
	d, err := safefs.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.OpenFile(filepath.Base(path), flag, 0o600)
}

func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// tempGrace is the least age of a temporary directory that PruneMaterialized
// removes: longer than any materialization.
const tempGrace = time.Hour

// PruneStats reports what PruneMaterialized did (or, dry, would do).
type PruneStats struct {
	// Removed are the manifest digests whose directories went.
	Removed []string `json:"removed"`
	// FreedBytes is the disk space their files took (sparse files count
	// what they allocate).
	FreedBytes int64 `json:"freedBytes"`
	// InUse counts the directories a running sandbox uses, Recent those
	// used within the grace period.
	InUse  int `json:"inUse"`
	Recent int `json:"recent"`
}

// PruneMaterialized removes the materialized snapshots under cacheDir that
// no sandbox uses and none has used for grace, with their use files, and
// the temporary directories of interrupted materializations older than
// grace and at least an hour. A directory from before use tracking counts
// as used now.
func PruneMaterialized(ctx context.Context, cacheDir string, grace time.Duration, dryRun bool) (PruneStats, error) {
	st := PruneStats{Removed: []string{}}
	ents, err := os.ReadDir(cacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("prune %s: %w", cacheDir, err)
	}
	var errs []error
	for _, e := range ents {
		if b, err := hex.DecodeString(e.Name()); err != nil || len(b) != 32 || !e.IsDir() {
			continue
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		errs = append(errs, pruneOne(ctx, cacheDir, d, grace, dryRun, &st))
	}
	if !dryRun {
		// A temporary directory may belong to a materialization running
		// now: only an old one is a crash's leftover.
		errs = append(errs, PruneTemp(cacheDir, max(grace, tempGrace)))
	}
	return st, errors.Join(errs...)
}

// pruneOne removes the materialization of d if it may go, and counts what
// it found in st.
func pruneOne(ctx context.Context, cacheDir string, d digest.Digest, grace time.Duration, dryRun bool, st *PruneStats) error {
	use, err := openInDir(usePath(cacheDir, d), os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("prune %s: %w", d, err)
	}
	defer use.Close()
	if err := unix.Flock(int(use.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if err == unix.EWOULDBLOCK {
			st.InUse++
			return nil
		}
		return fmt.Errorf("prune %s: lock: %w", d, err)
	}
	if !sameFile(use, use.Name()) {
		st.InUse++ // another prune removed it just now
		return nil
	}
	if info, err := use.Stat(); err != nil || time.Since(info.ModTime()) < grace {
		st.Recent++
		return nil
	}
	dir := CachePath(cacheDir, d)
	freed := allocated(dir)
	if !dryRun {
		// Renames and removals in cacheDir happen under its lock (publish).
		unlock, err := lockDir(ctx, cacheDir)
		if err != nil {
			return err
		}
		defer unlock()
		if err := removeDir(cacheDir, dir); err != nil {
			return err
		}
		// No Use of d runs while we hold its lock exclusively, and
		// lockFile retries on a file removed under it.
		os.Remove(use.Name())
		log.G(ctx).WithFields(log.Fields{"digest": d, "freed_bytes": freed}).Info("removed an unused materialized snapshot")
	}
	st.Removed = append(st.Removed, d.String())
	st.FreedBytes += freed
	return nil
}

// allocated sums the blocks the files under dir take.
func allocated(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil {
			if info, err := e.Info(); err == nil {
				if s, ok := info.Sys().(*syscall.Stat_t); ok {
					n += s.Blocks * 512
				}
			}
		}
		return nil
	})
	return n
}
