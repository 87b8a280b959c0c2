package configs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// TestNamespaceKeyOptions: with encryption_key_dir, a sandbox of namespace
// N writes and reads with N's key only, a sandbox of no namespace gets no
// key, and encryption is required unless the file says otherwise.
func TestNamespaceKeyOptions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("namespace key tests need root: key files must belong to root (run go test as root)")
	}
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := snapshot.GenerateEncryptionKey(filepath.Join(dir, ns)); err != nil {
			t.Fatal(err)
		}
	}
	sc := Default().Snapshot
	sc.EncryptionKeyDir = dir
	wa, err := sc.WriteOptions("team-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.WriteOptions(""); err == nil {
		t.Fatal("a checkpoint without a namespace got a key from the key dir")
	}
	ra, err := sc.ReadOptions("team-a")
	if err != nil {
		t.Fatal(err)
	}
	rb, err := sc.ReadOptions("team-b")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case len(wa.EncryptionKey) != 32 || !bytes.Equal(wa.EncryptionKey, ra.DecryptionKey):
		t.Fatal("team-a does not read with the key it writes with")
	case bytes.Equal(ra.DecryptionKey, rb.DecryptionKey):
		t.Fatal("team-a and team-b share a key")
	case !ra.RequireEncryption:
		t.Fatal("a key dir does not require encryption")
	}
	if r0, err := sc.ReadOptions(""); err != nil || r0.DecryptionKey != nil {
		t.Fatalf("no namespace: key %v, %v", r0.DecryptionKey != nil, err)
	}
	f := false
	sc.RequireEncryption = &f
	if ro, err := sc.ReadOptions("team-a"); err != nil || ro.RequireEncryption {
		t.Fatalf("require_encryption = false: %+v, %v", ro.RequireEncryption, err)
	}
}

// TestVerifyKeyRequiresSignature: naming a verify key requires signatures
// unless require_signature = false is set explicitly.
func TestVerifyKeyRequiresSignature(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	if err := snapshot.GenerateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	sc := Default().Snapshot
	sc.VerifyKey = pub
	ro, err := sc.ReadOptions("")
	if err != nil {
		t.Fatal(err)
	}
	if !ro.RequireSignature || ro.PublicKey == nil {
		t.Fatalf("verify_key alone: require %v, key %v", ro.RequireSignature, ro.PublicKey != nil)
	}
	f := false
	sc.RequireSignature = &f
	if ro, err = sc.ReadOptions(""); err != nil || ro.RequireSignature {
		t.Fatalf("require_signature = false: %v, %v", ro.RequireSignature, err)
	}
}

// TestNodeKeyTenantOptions: with one node-wide encryption_key, a sandbox
// of namespace team-a writes with team-a's key derived from it (never the
// node key itself), and a team-b sandbox's read options do not open it.
func TestNodeKeyTenantOptions(t *testing.T) {
	ctx := context.Background()
	key := filepath.Join(t.TempDir(), "node.key")
	if err := snapshot.GenerateEncryptionKey(key); err != nil {
		t.Fatal(err)
	}
	node, err := snapshot.LoadEncryptionKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sc := Default().Snapshot
	sc.EncryptionKey = key
	wa, err := sc.WriteOptions("team-a")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(wa.EncryptionKey, node) || wa.Tenant != "team-a" {
		t.Fatalf("team-a writes with the node key itself or no tenant (%q)", wa.Tenant)
	}
	store, _, err := stores.Open(ctx, "file://"+filepath.Join(t.TempDir(), "store")+":a", stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	src := &snapshot.Source{Files: []snapshot.SourceFile{snapshot.BytesSourceFile(snapshot.FileRAM, bytes.Repeat([]byte("team-a secret "), 1<<14))}}
	if _, _, err := snapshot.Write(ctx, store, "a", src, wa); err != nil {
		t.Fatal(err)
	}
	read := func(ns string) error {
		ro, err := sc.ReadOptions(ns)
		if err != nil {
			return err
		}
		s, err := snapshot.Open(ctx, store, "a", ro)
		if err != nil {
			return err
		}
		_, err = s.Verify(ctx)
		return err
	}
	if err := read("team-a"); err != nil {
		t.Fatalf("team-a: %v", err)
	}
	if err := read("team-b"); err == nil {
		t.Fatal("team-b decrypted team-a's snapshot under the node key")
	} else {
		t.Logf("team-b: %v", err)
	}
	// An old snapshot sealed with the node key itself: refused unless
	// legacy_node_key.
	if _, _, err := snapshot.Write(ctx, store, "old", src, snapshot.WriteOptions{EncryptionKey: node}); err != nil {
		t.Fatal(err)
	}
	ro, _ := sc.ReadOptions("team-a")
	if _, err := snapshot.Open(ctx, store, "old", ro); err == nil || !strings.Contains(err.Error(), "legacy_node_key") {
		t.Fatalf("node-key snapshot without legacy_node_key: %v", err)
	}
	sc.LegacyNodeKey = true
	ro, _ = sc.ReadOptions("team-a")
	if _, err := snapshot.Open(ctx, store, "old", ro); err != nil {
		t.Fatalf("legacy_node_key = true: %v", err)
	}
}
