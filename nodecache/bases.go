package nodecache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/stores"
)

// Bases are the node's shared guest RAM bases (<cache>/bases): the full
// RAM of a snapshot, written once per node into a sealed memfd that every
// clone of it on the node maps privately (copy-on-write), so that N clones
// share one copy of the pages none of them wrote.
//
// There is no node agent: a memfd lives as long as some process holds it
// open, and a shim finds the one another shim holds through a registry of
// holders, then reopens it through /proc/<pid>/fd/<fd> (root may):
//
//	<dir>/<storeid>-<hex>.lock       flock held while one Share looks up,
//	                                 fills or registers the base of that key
//	<dir>/<storeid>-<hex>/<pid>-<fd> a holder: process pid holds the base
//	                                 at descriptor fd (JSON: boot, pid, fd,
//	                                 start time, memfd dev+ino, size)
//	<dir>/<storeid>-<hex>/.tmp-*     a holder record being written
//
// Files are 0600 in 0700 directories, records are written whole (temp file
// and rename), and every file is opened beneath the directory without
// following a symlink. A key is per (store, snapshot): a tenant shares a
// base only with restores that read the same snapshot through the same
// store.
//
// A record is only a hint: before its memfd is used, the holder must be a
// live root process (holders are shims; QEMUs run as other uids) whose
// start time is the record's, and the descriptor must be a memfd named for
// the key, of the record's dev+ino, of the requested size, with every seal
// (no write, shrink, grow, or new seal). A record that fails is removed.
// When the last holder exits the memfd is freed: that is the eviction.
type Bases struct{ dir string }

// OpenBases returns the bases registry in dir (made when first needed).
// Node.Bases is the node's.
func OpenBases(dir string) *Bases { return &Bases{dir: dir} }

// BasesDir is where the node cache in dir keeps its bases registry.
func BasesDir(dir string) string { return filepath.Join(dir, "bases") }

// Bases returns the node's shared guest RAM bases.
func (n *Node) Bases() *Bases { return OpenBases(BasesDir(n.dir)) }

// Dir returns the registry's directory.
func (b *Bases) Dir() string { return b.dir }

// Base is one process's hold on a shared RAM base: a read-only descriptor
// of the sealed memfd, registered as a holder until Close.
type Base struct {
	f       *os.File
	reused  bool
	holders *safefs.Dir // the key's directory of records
	record  string

	mu     sync.Mutex
	closed bool
}

// File returns this process's descriptor of the memfd (read-only; the
// seals forbid writes through any descriptor).
func (b *Base) File() *os.File { return b.f }

// Path returns the path of the memfd in this process, what QEMU's
// mem-path opens (a child gets its own number for it).
func (b *Base) Path() string { return "/proc/self/fd/" + strconv.Itoa(int(b.f.Fd())) }

// Reused reports whether the base was found on the node, not filled here.
func (b *Base) Reused() bool { return b.reused }

// Close unregisters this holder and closes the descriptor; once the last
// holder of the node closes (or exits), the memory is freed. Idempotent.
func (b *Base) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	// The record goes first: a record must never outlive the descriptor
	// it names (a later descriptor of the same number is no base).
	err := b.holders.Remove(b.record)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil // a peer found it invalid and removed it
	}
	return errors.Join(err, b.f.Close(), b.holders.Close())
}

// baseSeals are the seals a base carries: nobody, not even a compromised
// QEMU holding it O_RDWR, can change what another clone sees.
const baseSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Share returns the base of the snapshot with manifest digest d as read
// through the store with id store (StoreID), of size bytes: a live one
// another process of the node holds, verified, or else a new memfd that
// fill writes (it gets the memfd read-write, its size already set), then
// sealed and registered. Concurrent calls for one (store, d) on the node
// fill once: the others wait on the key's lock, for as long as ctx allows.
// On error nothing is left: no record, no descriptor.
func (b *Bases) Share(ctx context.Context, store string, d digest.Digest, size int64, fill func(*os.File) error) (*Base, error) {
	key, err := baseKey(store, d, size)
	if err != nil {
		return nil, err
	}
	root, err := b.open()
	if err != nil {
		return nil, fmt.Errorf("share base %s: %w", key, err)
	}
	defer root.Close()
	lock, err := lockFile(ctx, filepath.Join(b.dir, key+".lock"), unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("share base %s: %w", key, err)
	}
	defer lock.Close() // closing releases the lock
	holders, err := root.MkdirAll(key, 0o700)
	if err != nil {
		return nil, fmt.Errorf("share base %s: %w", key, err)
	}
	base, err := shareLocked(ctx, holders, key, size, fill)
	if err != nil {
		holders.Close()
		return nil, fmt.Errorf("share base %s: %w", key, err)
	}
	return base, nil
}

// shareLocked finds or fills the base of key and registers this process
// as a holder; the caller holds the key's lock.
func shareLocked(ctx context.Context, holders *safefs.Dir, key string, size int64, fill func(*os.File) error) (*Base, error) {
	f, err := findHeld(ctx, holders, key, size)
	if err != nil {
		return nil, err
	}
	reused := f != nil
	if !reused {
		if f, err = fillBase(key, size, fill); err != nil {
			return nil, err
		}
	}
	base := &Base{f: f, reused: reused, holders: holders}
	if base.record, err = register(holders, f, size); err != nil {
		f.Close()
		return nil, err
	}
	return base, nil
}

// baseKey validates what names a base before it reaches a path.
func baseKey(store string, d digest.Digest, size int64) (string, error) {
	if !validStoreID(store) {
		return "", fmt.Errorf("share base: store id %q: not a store id (StoreID): %w", store, errdefs.ErrInvalidArgument)
	}
	if err := stores.CheckDigest(d); err != nil {
		return "", fmt.Errorf("share base: %w", err)
	}
	if size <= 0 {
		return "", fmt.Errorf("share base: size %d: not positive: %w", size, errdefs.ErrInvalidArgument)
	}
	return store + "-" + d.Encoded(), nil
}

// open makes and opens the registry's directory (a path of the node's
// configuration, trusted; what is beneath it is opened without following
// a symlink).
func (b *Bases) open() (*safefs.Dir, error) {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, err
	}
	return safefs.OpenDir(b.dir)
}

// findHeld returns the memfd of the first valid holder record of key,
// reopened read-only, or nil if there is none. Invalid records are removed.
func findHeld(ctx context.Context, holders *safefs.Dir, key string, size int64) (*os.File, error) {
	ents, err := holders.ReadDir()
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if isTemp(e.Name()) {
			continue // being written; Prune removes an old one
		}
		f, err := openHolder(holders, e.Name(), key, size)
		if err == nil {
			return f, nil
		}
		l := log.G(ctx).WithError(err).WithField("record", filepath.Join(holders.Name(), e.Name()))
		if err := holders.Remove(e.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l = l.WithField("remove_error", err) // a non-empty directory: the next one is tried
		}
		l.Info("removed an invalid base holder record")
	}
	return nil, nil
}

// openHolder reads the record name and opens the memfd it names, verified.
func openHolder(holders *safefs.Dir, name, key string, size int64) (*os.File, error) {
	b, err := holders.ReadFile(name, recordLimit)
	if err != nil {
		return nil, err
	}
	rec, err := parseRecord(name, b)
	if err != nil {
		return nil, err
	}
	return rec.open(key, size)
}

// fillBase makes a memfd of size bytes, lets fill write it, seals it, and
// returns it reopened read-only and verified like any holder's.
func fillBase(key string, size int64, fill func(*os.File) error) (*os.File, error) {
	fd, err := unix.MemfdCreate(memfdName(key), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	rw := os.NewFile(uintptr(fd), "memfd:"+memfdName(key))
	defer rw.Close() // the read-only reopening keeps the memory
	if err := rw.Truncate(size); err != nil {
		return nil, fmt.Errorf("size the memfd: %w", err)
	}
	if err := fill(rw); err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, baseSeals); err != nil {
		// EBUSY: fill left a shared writable mapping.
		return nil, fmt.Errorf("seal the memfd: %w", err)
	}
	id, err := fileID(rw)
	if err != nil {
		return nil, err
	}
	return openMemfd(procFD(os.Getpid(), fd), key, size, id)
}

// register records that this process holds the base at f, written whole
// (temp file, rename); it returns the record's name.
func register(holders *safefs.Dir, f *os.File, size int64) (string, error) {
	rec, err := selfRecord(f, size)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	tmp := tempPrefix + randomSuffix()
	w, err := holders.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = w.Write(b)
	if err = errors.Join(err, w.Close()); err == nil {
		// A record of the same name can only be stale: this process holds
		// that descriptor now.
		err = holders.Rename(tmp, holders, rec.name())
	}
	if err != nil {
		holders.Remove(tmp)
		return "", fmt.Errorf("register base holder: %w", err)
	}
	return rec.name(), nil
}

// BasePruneStats reports what Bases.Prune found (or, dry, would remove).
type BasePruneStats struct {
	// Live counts the valid records of running holders; Removed the
	// records of dead or invalid holders, and the keys left without any.
	Live    int `json:"live"`
	Removed int `json:"removed"`
}

// Prune removes the records of dead or invalid holders (each Share also
// removes those it meets), the directories and locks of keys no process
// holds, and record temp files older than an hour. A key a Share is
// working on is left alone.
func (b *Bases) Prune(ctx context.Context, dryRun bool) (BasePruneStats, error) {
	var st BasePruneStats
	root, err := safefs.OpenDir(b.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("prune bases: %w", err)
	}
	defer root.Close()
	ents, err := root.ReadDir()
	if err != nil {
		return st, fmt.Errorf("prune bases: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() && validBaseKey(e.Name()) {
			errs = append(errs, b.pruneKey(ctx, root, e.Name(), dryRun, &st))
		}
	}
	return st, errors.Join(errs...)
}

// pruneKey prunes the records of one key, holding its lock (not waiting
// for it: a Share holds it only briefly, or while it fills).
func (b *Bases) pruneKey(ctx context.Context, root *safefs.Dir, key string, dryRun bool, st *BasePruneStats) error {
	if !dryRun {
		lock, err := openInDir(filepath.Join(b.dir, key+".lock"), os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("prune base %s: %w", key, err)
		}
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return nil // a Share is at work on it
		}
		if !sameFile(lock, lock.Name()) {
			return nil // another prune removed it just now
		}
	}
	holders, err := root.Sub(key)
	if err != nil {
		return fmt.Errorf("prune base %s: %w", key, err)
	}
	defer holders.Close()
	ents, err := holders.ReadDir()
	if err != nil {
		return fmt.Errorf("prune base %s: %w", key, err)
	}
	live := 0
	for _, e := range ents {
		if isTemp(e.Name()) {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > tempGrace && !dryRun {
				holders.Remove(e.Name())
			}
			continue
		}
		if liveRecord(holders, e.Name(), key) {
			live++
			continue
		}
		st.Removed++
		if !dryRun {
			holders.Remove(e.Name())
		}
	}
	st.Live += live
	if live == 0 && !dryRun {
		// No Share of key runs while its lock is held; one waiting for
		// the lock file finds it removed and makes a new one (lockFile).
		if root.Remove(key) == nil {
			root.Remove(key + ".lock")
			log.G(ctx).WithField("key", key).Debug("removed a base no process holds")
		}
	}
	return nil
}

// liveRecord reports whether the record name is a valid holder's (the
// size it names is the one it is checked against).
func liveRecord(holders *safefs.Dir, name, key string) bool {
	b, err := holders.ReadFile(name, recordLimit)
	if err != nil {
		return false
	}
	rec, err := parseRecord(name, b)
	if err != nil {
		return false
	}
	f, err := rec.open(key, rec.Size)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// validBaseKey accepts what baseKey makes.
func validBaseKey(key string) bool {
	store, hexd, ok := strings.Cut(key, "-")
	return ok && validStoreID(store) && stores.CheckDigest(digest.NewDigestFromEncoded(digest.SHA256, hexd)) == nil
}
