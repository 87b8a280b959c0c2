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
