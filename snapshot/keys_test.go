package snapshot

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// keyDir makes a root-owned 0700 key directory with a key for each
// namespace.
func keyDir(t *testing.T, namespaces ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("namespace key tests need root: key files must belong to root (run go test as root)")
	}
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		if err := GenerateEncryptionKey(filepath.Join(dir, ns)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadNamespaceKey(t *testing.T) {
	dir := keyDir(t, "team-a", "team-b")
	a, err := LoadNamespaceKey(dir, "team-a")
	if err != nil || len(a) != 32 {
		t.Fatalf("team-a key: %d bytes, %v", len(a), err)
	}
	b, err := LoadNamespaceKey(dir, "team-b")
	if err != nil || bytes.Equal(a, b) {
		t.Fatalf("team-b key: equal to team-a's %v, %v", bytes.Equal(a, b), err)
	}

	link := filepath.Join(dir, "team-link")
	if err := os.Symlink(filepath.Join(dir, "team-a"), link); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "team-open")
	if err := os.WriteFile(open, a, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "team-foreign")
	if err := os.WriteFile(foreign, a, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "team-fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]func(error) bool{
		"team-link":    errdefs.IsPermissionDenied,
		"team-open":    errdefs.IsPermissionDenied,
		"team-foreign": errdefs.IsPermissionDenied,
		"team-fifo":    errdefs.IsPermissionDenied,
		"team-c":       errdefs.IsNotFound,
		"../keys/x":    errdefs.IsInvalidArgument,
		"..":           errdefs.IsInvalidArgument,
		"":             errdefs.IsFailedPrecondition,
	} {
		done := make(chan error, 1)
		go func() { _, err := LoadNamespaceKey(dir, ns); done <- err }()
		select {
		case err := <-done:
			if !want(err) {
				t.Errorf("namespace %q: %v", ns, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("namespace %q: LoadNamespaceKey blocked", ns)
		}
	}

	// The directory itself: no symlink, not writable by others.
	dlink := filepath.Join(t.TempDir(), "keys-link")
	if err := os.Symlink(dir, dlink); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadNamespaceKey(dlink, "team-a"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("symlinked key dir: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadNamespaceKey(dir, "team-a"); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "mode") {
		t.Errorf("world-writable key dir: %v", err)
	}
}

// TestNamespaceKeysSeparateTenants: a checkpoint encrypted with namespace
// A's key cannot be opened with B's, and a plaintext snapshot is refused
// where encryption is required (configs maps encryption_key_dir onto these
// options).
func TestNamespaceKeysSeparateTenants(t *testing.T) {
	ctx := context.Background()
	dir := keyDir(t, "team-a", "team-b")
	ka, err := LoadNamespaceKey(dir, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	kb, err := LoadNamespaceKey(dir, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "a", WriteOptions{EncryptionKey: ka})
	ts.write(t, store, "plain", WriteOptions{})

	ra := ReadOptions{DecryptionKey: ka, RequireEncryption: true}
	s, err := Open(ctx, store, "a", ra)
	if err != nil {
		t.Fatalf("team-a opens its own snapshot: %v", err)
	}
	if _, err := s.Verify(ctx); err != nil {
		t.Fatalf("team-a verifies its own snapshot: %v", err)
	}
	if _, err := Open(ctx, store, "a", ReadOptions{DecryptionKey: kb, RequireEncryption: true}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "key") {
		t.Fatalf("team-b opened team-a's snapshot: %v", err)
	}
	if _, err := Open(ctx, store, "plain", ra); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "not encrypted") {
		t.Fatalf("plaintext snapshot where encryption is required: %v", err)
	}
}

// TestRequireSignature: with a verify key and RequireSignature, an unsigned
// snapshot is refused; without RequireSignature it opens.
func TestRequireSignature(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	if err := GenerateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	pk, err := LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	newTestSnap(t).write(t, store, "unsigned", WriteOptions{})
	if _, err := Open(context.Background(), store, "unsigned", ReadOptions{PublicKey: pk, RequireSignature: true}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("unsigned snapshot with a verify key: %v", err)
	}
	if _, err := Open(context.Background(), store, "unsigned", ReadOptions{PublicKey: pk}); err != nil {
		t.Fatalf("signature not required: %v", err)
	}
}
