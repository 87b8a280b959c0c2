package sandbox

import (
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/vmm"
)

func TestRAMPathUniquePerStateDir(t *testing.T) {
	a := ramPath("/dev/shm", "/run/a/vm/0123456789abcdef")
	b := ramPath("/dev/shm", "/run/b/vm/0123456789abcdef")
	if a == b || !strings.HasPrefix(a, "/dev/shm/cryo-") {
		t.Fatalf("ram paths %q %q", a, b)
	}
}

func TestStoreID(t *testing.T) {
	for to, want := range map[string]string{
		"file:///var/lib/cryo/store/agent:v1":  "file:///var/lib/cryo/store/agent",
		"oci://localhost:5000/cryo/agent:v2":   "oci://localhost:5000/cryo/agent",
		"s3://bucket/prefix/agent:latest":      "s3://bucket/prefix/agent",
		"file:///var/lib/cryo/store/agent":     "file:///var/lib/cryo/store/agent",
		"oci://localhost:5000/cryo/agent:v1.2": "oci://localhost:5000/cryo/agent",
	} {
		if got, err := storeID(to); err != nil || got != want {
			t.Errorf("storeID(%q) = %q, %v; want %q", to, got, err, want)
		}
	}
}

// TestQEMUUIDLocksHostWide: two installations with their own state roots
// lease QEMU uids through one lock directory, so they never hand out the
// same uid twice.
func TestQEMUUIDLocksHostWide(t *testing.T) {
	a, b := configs.Default(), configs.Default()
	a.Runtime.StateRoot, b.Runtime.StateRoot = "/run/cryo-a", "/run/cryo-b"
	da, db := confined(vmm.Config{}, testNode(t, a).VM).Confine.LockDir, confined(vmm.Config{}, testNode(t, b).VM).Confine.LockDir
	if da != db || (da != "" && da != vmm.DefaultUIDLockDir) {
		t.Fatalf("uid lock dirs %q and %q: want both vmm's host-wide %q", da, db, vmm.DefaultUIDLockDir)
	}
}
