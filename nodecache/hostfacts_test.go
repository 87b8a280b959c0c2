package nodecache_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/opencontainers/go-digest"
)

func TestHostFactsCache(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "vmlinuz")
	os.WriteFile(f, []byte("kernel v1"), 0o644)
	node, err := nodecache.Open(filepath.Join(dir, "cache"), nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := node.Facts()
	calls := 0
	compute := func(p string) (string, error) {
		calls++
		b, err := os.ReadFile(p)
		return digest.FromBytes(b).String(), err
	}
	d1, err := c.Get(f, "sha256", compute)
	if err != nil || !strings.HasPrefix(d1, "sha256:") {
		t.Fatalf("get = %q, %v", d1, err)
	}
	if d, _ := c.Get(f, "sha256", compute); d != d1 || calls != 1 {
		t.Fatalf("second get = %q after %d computations, want a cache hit", d, calls)
	}
	// a changed file is a miss
	os.WriteFile(f, []byte("kernel v2, longer"), 0o644)
	if d, _ := c.Get(f, "sha256", compute); d == d1 || calls != 2 {
		t.Fatalf("changed file: %q after %d computations", d, calls)
	}
}

// QEMUVersion runs the binary once, then answers from the facts.
func TestHostFactsQEMUVersion(t *testing.T) {
	dir := t.TempDir()
	qemu, count := filepath.Join(dir, "qemu-system-x86_64"), filepath.Join(dir, "runs")
	script := "#!/bin/sh\necho x >> " + count + "\necho 'QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u16)'\n"
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	node, err := nodecache.Open(filepath.Join(dir, "cache"), nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if v, err := node.Facts().QEMUVersion(qemu); v != "7.2.22" || err != nil {
			t.Fatalf("QEMUVersion = %q, %v", v, err)
		}
	}
	if b, _ := os.ReadFile(count); strings.Count(string(b), "x") != 1 {
		t.Fatalf("qemu ran %d times, want once", strings.Count(string(b), "x"))
	}
	st, err := os.Stat(filepath.Join(dir, "cache", "host-facts.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("host facts file: %v, %v", st, err)
	}
}
