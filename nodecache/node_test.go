package nodecache_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/nodecache"
)

// TestNodePrune: what `cryoctl gc` does to the node: the blob cache down to
// its limit (a dry run removes nothing), the unused materialized snapshots
// out; every part lives where the layout says.
func TestNodePrune(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	unbounded, err := nodecache.Open(dir, nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := unbounded.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	if blobs.Dir() != filepath.Join(dir, "blobs") || unbounded.Snapshots().Dir() != nodecache.SnapshotsDir(dir) {
		t.Fatalf("layout: blobs %s, snapshots %s", blobs.Dir(), unbounded.Snapshots().Dir())
	}
	for i := range 3 {
		b := blobN(uint64(i), 600)
		if err := blobs.Add(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	bounded, err := nodecache.Open(dir, nodecache.Options{MaxBlobBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := bounded.Prune(ctx, nodecache.PruneOptions{DryRun: true}); err != nil || res.BlobsFreed != 0 || res.Blobs.Bytes != 1800 {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	res, err := bounded.Prune(ctx, nodecache.PruneOptions{})
	if err != nil || res.BlobsFreed != 1200 || res.Blobs.Bytes != 600 || res.Blobs.MaxBytes != 1000 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	if _, err := nodecache.Open("relative", nodecache.Options{}); err == nil {
		t.Fatal("a relative directory was accepted")
	}
}

// TestNodePruneKeepsLeasedBlobs: blobs a running lazy sandbox leased for
// its snapshot stay in the blob cache through a prune to any limit; once
// no sandbox holds the snapshot's use-lock, the lease goes and so may they.
func TestNodePruneKeepsLeasedBlobs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	node, err := nodecache.Open(dir, nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := node.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	var leased []digest.Digest
	for i := range 3 {
		b := blobN(uint64(i), 600)
		if err := blobs.Add(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			leased = append(leased, b.Desc.Digest)
		}
	}
	snap := digest.FromString("snapshot")
	release, err := node.Snapshots().Use(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Snapshots().Lease(snap, leased); err != nil {
		t.Fatal(err)
	}
	gc, err := nodecache.Open(dir, nodecache.Options{MaxBlobBytes: 1}) // cryoctl gc's view
	if err != nil {
		t.Fatal(err)
	}
	if res, err := gc.Prune(ctx, nodecache.PruneOptions{}); err != nil || res.BlobsFreed != 600 || res.Blobs.Bytes != 1200 {
		t.Fatalf("prune while the snapshot is in use: %+v, %v", res, err)
	}
	release()
	if res, err := gc.Prune(ctx, nodecache.PruneOptions{}); err != nil || res.Blobs.Bytes != 0 {
		t.Fatalf("prune once no sandbox uses it: %+v, %v", res, err)
	}
	if m, _ := filepath.Glob(filepath.Join(node.Snapshots().Dir(), ".*.blobs")); len(m) != 0 {
		t.Fatalf("lease left: %v", m)
	}
}
