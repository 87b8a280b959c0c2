package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBundleFiles(t *testing.T) {
	bundle := t.TempDir()
	state := sandboxStateDir("/run/cryo", "default", "c1")
	if !strings.HasPrefix(state, "/run/cryo/vm/") || state == sandboxStateDir("/run/cryo", "other", "c1") {
		t.Fatalf("state dir %q is not unique per namespace and id", state)
	}
	if len(state)+len("/qmp.sock") > 100 {
		t.Fatalf("state dir %q too long for unix sockets", state)
	}
	if err := writeStatePointer(bundle, state); err != nil {
		t.Fatal(err)
	}
	if got, err := readStatePointer(bundle); err != nil || got != state {
		t.Fatalf("readStatePointer = %q, %v", got, err)
	}
	for _, bad := range []string{"relative/vm/x", "/etc", "/run/cryo/vm/../../etc"} {
		os.WriteFile(filepath.Join(bundle, statePointerFile), []byte(bad), 0o600)
		if _, err := readStatePointer(bundle); err == nil {
			t.Errorf("state pointer %q accepted: delete would remove it", bad)
		}
	}
	at := time.Now().Round(0)
	if err := writeExitRecord(bundle, exitRecord{Pid: 7, Status: 3, ExitedAt: at}); err != nil {
		t.Fatal(err)
	}
	if e, err := readExitRecord(bundle); err != nil || e.Pid != 7 || e.Status != 3 || !e.ExitedAt.Equal(at) {
		t.Fatalf("exit record = %+v, %v", e, err)
	}
	// the disk pointer must name the disk dir of the same sandbox
	sd := t.TempDir()
	os.WriteFile(filepath.Join(sd, diskPointerFile), []byte("/var/lib/cryo/disks/"+filepath.Base(sd)+"\n"), 0o600)
	if d, err := readDiskPointer(sd); err != nil || filepath.Base(d) != filepath.Base(sd) {
		t.Fatalf("readDiskPointer = %q, %v", d, err)
	}
	os.WriteFile(filepath.Join(sd, diskPointerFile), []byte("/var/lib\n"), 0o600)
	if _, err := readDiskPointer(sd); err == nil {
		t.Fatal("a disk pointer to another directory was accepted")
	}
}

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
