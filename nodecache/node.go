// Package nodecache is the node's cache of snapshots, shared by every shim
// and cryoctl on the node, in one directory (configs: [snapshot] cache_dir):
//
//	<dir>/blobs/          verified blobs (Blobs), bounded, least recently used out
//	<dir>/snapshots/      materialized snapshots and their use-locks (Snapshots)
//	<dir>/bases/          holders of shared guest RAM bases (Bases)
//	<dir>/host-facts.json facts about host files (HostFacts)
//
// Everything in it was verified before it entered, or is made from what
// was; every file is opened beneath the directory without following a
// symlink. Node ties the parts to their places, and Prune is what
// `cryoctl gc` does to the node.
package nodecache

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/stores"
)

// Options tune a Node.
type Options struct {
	// MaxBlobBytes bounds the blob cache (<= 0: no bound).
	MaxBlobBytes int64
	// BlobDir, if set, is the blob cache's directory instead of <dir>/blobs.
	BlobDir string
}

// Node is the node cache in one directory.
type Node struct {
	dir   string
	opts  Options
	snaps *Snapshots

	blobsOnce sync.Once
	blobs     *Blobs
	blobsErr  error
}

// Open returns the node cache in dir (an absolute path). It touches no
// file: each part is made when first used.
func Open(dir string, opts Options) (*Node, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("node cache %q: not an absolute path: %w", dir, errdefs.ErrInvalidArgument)
	}
	if opts.BlobDir == "" {
		opts.BlobDir = filepath.Join(dir, "blobs")
	}
	return &Node{dir: dir, opts: opts, snaps: OpenSnapshots(SnapshotsDir(dir))}, nil
}

// SnapshotsDir is where the node cache in dir keeps materialized snapshots.
func SnapshotsDir(dir string) string { return filepath.Join(dir, "snapshots") }

// Dir returns the node cache's directory.
func (n *Node) Dir() string { return n.dir }

// Blobs returns the blob cache, opening it on first use (which reads its
// index from the directory and removes stale downloads).
func (n *Node) Blobs() (*Blobs, error) {
	n.blobsOnce.Do(func() {
		n.blobs, n.blobsErr = OpenBlobs(n.opts.BlobDir, n.opts.MaxBlobBytes)
		if n.blobsErr == nil {
			// Every eviction, this process's own included (a commit over
			// cache_size), keeps what running lazy sandboxes of any
			// process of the node leased.
			n.blobs.leased = n.snaps.Leased
		}
	})
	return n.blobs, n.blobsErr
}

// Store wraps s so that its blobs are read through the blob cache. Set
// opts.StoreID (StoreID of the store's URL): without it, every cached blob
// is confirmed with the store again by each CachingStore.
func (n *Node) Store(s stores.Store, opts CachingOptions) (*CachingStore, error) {
	b, err := n.Blobs()
	if err != nil {
		return nil, err
	}
	return NewCachingStore(s, b, opts), nil
}

// Snapshots returns the directory of materialized snapshots.
func (n *Node) Snapshots() *Snapshots { return n.snaps }

// Facts returns the node's host facts.
func (n *Node) Facts() HostFacts { return HostFacts{path: filepath.Join(n.dir, "host-facts.json")} }

// PruneOptions tune Prune.
type PruneOptions struct {
	// KeepMaterialized keeps unused materialized snapshots that a restore
	// used within this long.
	KeepMaterialized time.Duration
	// DryRun reports without removing.
	DryRun bool
}

// PruneResult is what Prune did.
type PruneResult struct {
	// BlobsFreed are the bytes evicted to bring the blob cache to its
	// limit; Blobs its state after.
	BlobsFreed   int64
	Blobs        BlobStats
	Materialized PruneStats
	// Bases are the shared RAM bases' holder records (Bases.Prune).
	Bases BasePruneStats
}

// Prune trims the blob cache to its limit, removes the materialized
// snapshots no sandbox uses (Snapshots.Prune) and the records of shared
// RAM bases' dead holders (Bases.Prune).
func (n *Node) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	b, err := n.Blobs()
	if err != nil {
		return res, err
	}
	// What running lazy sandboxes read stays, whatever the limit.
	leased, err := n.snaps.leased(opts.DryRun)
	if err != nil {
		return res, err
	}
	for _, d := range leased {
		defer b.Pin(d)()
	}
	if limit := b.Stats().MaxBytes; !opts.DryRun && limit > 0 {
		if res.BlobsFreed, err = b.Prune(limit); err != nil {
			return res, err
		}
	}
	if !opts.DryRun {
		if _, err := b.pruneConfirmations(); err != nil {
			return res, err
		}
	}
	res.Blobs = b.Stats()
	if res.Materialized, err = n.snaps.Prune(ctx, opts.KeepMaterialized, opts.DryRun); err != nil {
		return res, err
	}
	res.Bases, err = n.Bases().Prune(ctx, opts.DryRun)
	return res, err
}
