package snapshot

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestNodeKeyTenants: under one node key, a snapshot sealed for namespace
// a is refused by name in namespace b, and relabelling it for b does not
// help: b's derived key does not open a's chunks.
func TestNodeKeyTenants(t *testing.T) {
	ctx := context.Background()
	node := bytes.Repeat([]byte{9}, 32)
	if bytes.Equal(TenantKey(node, "a"), TenantKey(node, "b")) || bytes.Equal(TenantKey(node, "a"), node) {
		t.Fatal("tenant keys are not distinct")
	}
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "a", WriteOptions{EncryptionKey: TenantKey(node, "a"), Tenant: "a"})

	s, err := Open(ctx, store, "a", ReadOptions{NodeKey: node, Tenant: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if e := s.Metadata.Encryption; e.Tenant != "a" || s.Metadata.FormatVersion != FormatVersionLineage {
		t.Fatalf("encryption %+v, version %d", e, s.Metadata.FormatVersion)
	}
	if _, err := s.Verify(ctx); err != nil {
		t.Fatalf("own namespace: %v", err)
	}
	_, err = Open(ctx, store, "a", ReadOptions{NodeKey: node, Tenant: "b"})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), `sealed for namespace "a"`) {
		t.Fatalf("namespace b opened a's snapshot: %v", err)
	}
	// A store writer relabels it for b, key ID included: b's key still
	// does not decrypt a's chunks.
	rewrite(t, store, "a", func(_ *ocispec.Manifest, md *Metadata) {
		md.Encryption.Tenant, md.Encryption.KeyID = "b", KeyID(TenantKey(node, "b"))
	})
	s, err = Open(ctx, store, "a", ReadOptions{NodeKey: node, Tenant: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(ctx); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "decrypt chunk") {
		t.Fatalf("namespace b decrypted a's relabelled chunks: %v", err)
	}
}

// TestLineageSplice: chunks of two snapshots sealed with one key at the
// same place cannot be mixed across lineages; within one lineage they
// can (only a signature defends that).
func TestLineageSplice(t *testing.T) {
	ctx := context.Background()
	key := bytes.Repeat([]byte{5}, 32)
	ts := newTestSnap(t)
	store := newMemStore()
	open := func(ref string) *Snapshot {
		s, err := Open(ctx, store, ref, ReadOptions{DecryptionKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ts.write(t, store, "x", WriteOptions{EncryptionKey: key})
	x := open("x")
	f, err := os.OpenFile(ts.paths.RAM, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("the other snapshot"), 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ts.write(t, store, "y", WriteOptions{EncryptionKey: key})
	ts.write(t, store, "z", WriteOptions{EncryptionKey: key, Lineage: x.Metadata.Encryption.Lineage})
	y, z := open("y"), open("z")
	if x.Metadata.Encryption.Lineage == y.Metadata.Encryption.Lineage {
		t.Fatal("two first checkpoints share a lineage")
	}
	splice := func(from *Snapshot) error {
		i := firstLayer(t, &from.Manifest, FileRAM)
		l := from.Manifest.Layers[i]
		rewrite(t, store, "x", func(m *ocispec.Manifest, _ *Metadata) {
			j := firstLayer(t, m, FileRAM)
			if m.Layers[j].Annotations[AnnotationOffset] != l.Annotations[AnnotationOffset] || m.Layers[j].Digest == l.Digest {
				t.Fatalf("layers %v and %v are not two chunks of one place", m.Layers[j], l)
			}
			m.Layers[j] = l
		})
		s, err := Open(ctx, store, "x", ReadOptions{DecryptionKey: key})
		if err != nil {
			return err
		}
		_, err = s.Verify(ctx)
		return err
	}
	if err := splice(y); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "decrypt chunk") {
		t.Fatalf("a chunk of another lineage was accepted: %v", err)
	}
	// Not defended: the same lineage (generations of one chain).
	if err := splice(z); err != nil {
		t.Fatalf("same lineage: %v", err)
	}
}

// TestLegacyNodeKey: a snapshot an older cryo sealed with the node key
// itself (version 1, no tenant, no lineage) is refused under a node key,
// naming legacy_node_key, and restored when it is set.
func TestLegacyNodeKey(t *testing.T) {
	ctx := context.Background()
	node := bytes.Repeat([]byte{9}, 32)
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "old", WriteOptions{EncryptionKey: node, noLineage: true})
	s, err := Open(ctx, store, "old", ReadOptions{DecryptionKey: node})
	if err != nil {
		t.Fatal(err)
	}
	if e := s.Metadata.Encryption; s.Metadata.FormatVersion != FormatVersionNoDelta || e.Lineage != "" || e.Tenant != "" {
		t.Fatalf("not an old snapshot: version %d, %+v", s.Metadata.FormatVersion, e)
	}
	_, err = Open(ctx, store, "old", ReadOptions{NodeKey: node, Tenant: "a"})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "legacy_node_key") {
		t.Fatalf("old node-key snapshot: %v", err)
	}
	s, err = Open(ctx, store, "old", ReadOptions{NodeKey: node, Tenant: "a", LegacyNodeKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(ctx); err != nil {
		t.Fatalf("legacy_node_key = true: %v", err)
	}
	// A version 3 snapshot may not drop its lineage, nor an old one gain
	// a tenant.
	rewrite(t, store, "old", func(_ *ocispec.Manifest, md *Metadata) { md.Encryption.Tenant = "a" })
	if _, err := Open(ctx, store, "old", ReadOptions{NodeKey: node, Tenant: "a", LegacyNodeKey: true}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("version 1 with a tenant: %v", err)
	}
}
