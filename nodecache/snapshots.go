package nodecache

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/stores"
)

// Snapshots is the node's directory of materialized snapshots
// (<cache>/snapshots), one directory per manifest digest, which
// snapshot.Materialize fills:
//
//	<dir>/<hex>/          a complete materialization (read-only files and a
//	                      completion marker naming the boot it was made in)
//	<dir>/.<hex>.use      its use-lock (see Use); its mtime is the last use
//	<dir>/.<hex>.lock     held while one materialization of it runs
//	<dir>/.<hex>.blobs    the blobs a lazily restored sandbox of it reads
//	                      from the blob cache (Lease)
//	<dir>/.tmp-*          materializations in progress, and stale ones
//
// A materialized snapshot is in use while a sandbox restored from it runs:
// its QEMU maps the RAM file, and its disk overlays name the materialized
// disks as backing files. Use marks this with a shared flock on its use
// file, held until release or until the process exits, however it exits.
// Prune removes a directory only while it holds that lock exclusively.
type Snapshots struct{ dir string }

// OpenSnapshots returns the directory of materialized snapshots dir (made
// when first needed). Node.Snapshots is the node's.
func OpenSnapshots(dir string) *Snapshots { return &Snapshots{dir: dir} }

// Dir returns the directory.
func (s *Snapshots) Dir() string { return s.dir }

// Path returns where the materialization of the snapshot with manifest
// digest d is (or will be).
func (s *Snapshots) Path(d digest.Digest) string {
	return filepath.Join(s.dir, d.Encoded())
}

func (s *Snapshots) usePath(d digest.Digest) string {
	return filepath.Join(s.dir, "."+d.Encoded()+".use")
}

// lockPath is the lock that makes concurrent materializations of one
// snapshot (from any process) download it once; it exists only while one
// runs.
func (s *Snapshots) lockPath(d digest.Digest, store string) string {
	if store != "" {
		return filepath.Join(s.dir, "."+d.Encoded()+"."+store+".lock")
	}
	return filepath.Join(s.dir, "."+d.Encoded()+".lock")
}

// Use marks the materialization of the snapshot with manifest digest d as
// in use and records the time. Take it before materializing, so that no
// prune removes the directory in between, and release it when the sandbox
// is gone.
func (s *Snapshots) Use(ctx context.Context, d digest.Digest) (release func(), _ error) {
	if err := stores.CheckDigest(d); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("use %s: %w", d, err)
	}
	f, err := lockFile(ctx, s.usePath(d), unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("use %s: %w", d, err)
	}
	now := unix.NsecToTimeval(time.Now().UnixNano())
	if err := unix.Futimes(int(f.Fd()), []unix.Timeval{now, now}); err != nil {
		log.G(ctx).WithError(err).Warn("record the use of a materialized snapshot")
	}
	return func() { f.Close() }, nil // closing releases the lock
}

func (s *Snapshots) leasePath(d digest.Digest) string {
	return filepath.Join(s.dir, "."+d.Encoded()+".blobs")
}

// Lease records that sandboxes holding d's use-lock read blobs from the
// node's blob cache (a lazy restore serves its RAM from them): Node.Prune
// keeps them for as long as any sandbox holds the lock. Call it with the
// lock held.
func (s *Snapshots) Lease(d digest.Digest, blobs []digest.Digest) error {
	if err := stores.CheckDigest(d); err != nil {
		return err
	}
	var b []byte
	for _, x := range blobs {
		if err := stores.CheckDigest(x); err != nil {
			return err
		}
		b = append(append(b, x.Encoded()...), '\n')
	}
	tmp := s.leasePath(d) + ".tmp-" + randomSuffix()
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("lease %s: %w", d, err)
	}
	if err := os.Rename(tmp, s.leasePath(d)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("lease %s: %w", d, err)
	}
	return nil
}

// Leased returns the blobs that running lazy sandboxes of the node read
// (the leases of snapshots in use).
func (s *Snapshots) Leased() ([]digest.Digest, error) { return s.leased(true) }

// leased returns the blobs of the leases of snapshots in use, and removes
// (unless dryRun) the leases of snapshots no sandbox uses.
func (s *Snapshots) leased(dryRun bool) ([]digest.Digest, error) {
	leases, err := filepath.Glob(filepath.Join(s.dir, ".*.blobs"))
	if err != nil {
		return nil, err
	}
	var out []digest.Digest
	for _, p := range leases {
		hexd := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "."), ".blobs")
		d := digest.NewDigestFromEncoded(digest.SHA256, hexd)
		if stores.CheckDigest(d) != nil {
			continue
		}
		inUse, err := s.inUse(d)
		if err != nil {
			return nil, err
		}
		if !inUse {
			if !dryRun {
				os.Remove(p)
			}
			continue
		}
		f, err := openInDir(p, os.O_RDONLY)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(io.LimitReader(f, 64<<20))
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Fields(string(b)) {
			if x := digest.NewDigestFromEncoded(digest.SHA256, l); stores.CheckDigest(x) == nil {
				out = append(out, x)
			}
		}
	}
	return out, nil
}

// inUse reports whether a sandbox holds d's use-lock.
func (s *Snapshots) inUse(d digest.Digest) (bool, error) {
	use, err := openInDir(s.usePath(d), os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer use.Close()
	switch err := unix.Flock(int(use.Fd()), unix.LOCK_EX|unix.LOCK_NB); err {
	case nil:
		return false, nil // closing unlocks
	case unix.EWOULDBLOCK:
		return true, nil
	default:
		return false, fmt.Errorf("lease %s: lock: %w", d, err)
	}
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

// tempGrace is the least age of a temporary directory that Prune
// removes: longer than any materialization.
const tempGrace = time.Hour

// PruneStats reports what Prune did (or, dry, would do).
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

// Prune removes the materialized snapshots that no sandbox uses and none
// has used for grace, with their use files, and the temporary directories
// of interrupted materializations older than grace and at least an hour. A
// directory from before use tracking counts as used now.
func (s *Snapshots) Prune(ctx context.Context, grace time.Duration, dryRun bool) (PruneStats, error) {
	st := PruneStats{Removed: []string{}}
	cacheDir := s.dir
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
		errs = append(errs, s.pruneOne(ctx, d, grace, dryRun, &st))
	}
	if !dryRun {
		// A temporary directory may belong to a materialization running
		// now: only an old one is a crash's leftover.
		errs = append(errs, s.PruneTemp(max(grace, tempGrace)))
	}
	return st, errors.Join(errs...)
}

// pruneOne removes the materialization of d if it may go, and counts what
// it found in st.
func (s *Snapshots) pruneOne(ctx context.Context, d digest.Digest, grace time.Duration, dryRun bool, st *PruneStats) error {
	cacheDir := s.dir
	use, err := openInDir(s.usePath(d), os.O_CREATE|os.O_RDWR)
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
	dir := s.Path(d)
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
