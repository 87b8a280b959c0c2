package configs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/cryo-runtime/cryo/snapshot"
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
