//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/snapshot"
)

// TestSignedEncryptedSnapshot: with signing and encryption keys in the node
// config, a checkpoint is signed and encrypted (no plaintext RAM in the
// store, files 0600), restores on a node with the keys, and is refused by a
// node that trusts another signing key.
func TestSignedEncryptedSnapshot(t *testing.T) {
	keys := t.TempDir()
	priv, pub, enc := filepath.Join(keys, "sign.key"), filepath.Join(keys, "sign.pub"), filepath.Join(keys, "enc.key")
	if err := snapshot.GenerateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.GenerateEncryptionKey(enc); err != nil {
		t.Fatal(err)
	}
	e := harness.Start(t, func(c *configs.Config) {
		// The keys alone require signatures and encryption (fail closed).
		c.Snapshot.SigningKey, c.Snapshot.VerifyKey = priv, pub
		c.Snapshot.EncryptionKey = enc
		lazyNode(c)
	})
	e.MustCtr(e.RunArgs("-d", harness.Image, "src", "sh", "-c", "echo TOP-SECRET-MARKER-$((6*7)) > /dev/shm/s; "+workload)...)
	waitCounting(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("sec:v1"))

	// No blob holds the secret in clear, and every blob is 0600.
	blobs, _ := filepath.Glob(filepath.Join(e.Dir, "store", "sec", "blobs", "sha256", "*"))
	if len(blobs) == 0 {
		t.Fatal("no blobs in the store")
	}
	for _, b := range blobs {
		st, err := os.Stat(b)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("blob %s has mode %v, want 0600", filepath.Base(b), st.Mode().Perm())
		}
		data, _ := os.ReadFile(b)
		if strings.Contains(string(data), "TOP-SECRET-MARKER-42") {
			t.Fatalf("blob %s holds the guest's secret in clear", filepath.Base(b))
		}
	}

	// Lazily first (nothing in the node cache yet): every chunk is verified and decrypted as the guest touches it.
	restore(t, e, "lazyback", e.StoreURL("sec:v1"), lazyMode)
	if out := e.MustCtr("task", "exec", "--exec-id", "x", "lazyback", "cat", "/dev/shm/s"); out != "TOP-SECRET-MARKER-42\n" {
		t.Fatalf("lazily restored secret %q", out)
	}
	restore(t, e, "back", e.StoreURL("sec:v1"))
	if out := e.MustCtr("task", "exec", "--exec-id", "x", "back", "cat", "/dev/shm/s"); out != "TOP-SECRET-MARKER-42\n" {
		t.Fatalf("restored secret %q", out)
	}

	// A node that trusts another key refuses the snapshot.
	priv2, pub2 := filepath.Join(keys, "other.key"), filepath.Join(keys, "other.pub")
	if err := snapshot.GenerateSigningKey(priv2, pub2); err != nil {
		t.Fatal(err)
	}
	c := e.Cfg
	c.Snapshot.VerifyKey = pub2
	other := filepath.Join(e.Dir, "other.toml")
	e.WriteConfig(other, c)
	disksBefore := diskDirs(t, e)
	_, errs, err := e.Ctr("run", "-d", "--runtime", harness.Runtime, "--runtime-config-path", other,
		"--annotation", "cryo.dev/restore-from="+e.StoreURL("sec:v1"), harness.Image, "wrongkey", "true")
	if err == nil || !strings.Contains(errs, "signature") {
		t.Fatalf("restore with another verify key: err=%v\n%s", err, errs)
	}
	e.MustCtr("c", "rm", "wrongkey")
	if after := diskDirs(t, e); after != disksBefore {
		t.Fatalf("the refused restore left disks behind: %d sandbox disk dirs, %d before", after, disksBefore)
	}
}

func diskDirs(t *testing.T, e *harness.Env) int {
	ents, err := os.ReadDir(filepath.Join(e.Dir, "disks"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(ents)
}
