package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cryo-runtime/cryo/internal/atomicfile"
)

// Files the shim keeps in a container's bundle so that the delete action can
// clean up from the bundle alone, after the shim process is gone.
const (
	// statePointerFile names the sandbox state directory (QEMU pid, sockets,
	// logs). Only the sandbox's own bundle has it.
	statePointerFile = "cryo-state"
	// exitRecordFile holds the init process's exit, for delete after a crash.
	exitRecordFile = "cryo-exit.json"
	// pidRecordFile holds the task's pid from its creation on, for delete
	// after a crash of a task that had not exited.
	pidRecordFile = "cryo-pid"
	// diskPointerFile, in the sandbox state dir, names the directory of
	// the sandbox's writable disks.
	diskPointerFile = "disks"
)

// sandboxStateDir returns a short, unique state directory for a sandbox:
// unix socket paths are limited to 108 bytes, bundle paths can be longer.
func sandboxStateDir(root, namespace, id string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + id))
	return filepath.Join(root, "vm", hex.EncodeToString(sum[:8]))
}

func writeStatePointer(bundle, stateDir string) error {
	return atomicfile.Write(filepath.Join(bundle, statePointerFile), []byte(stateDir+"\n"), 0o600)
}

func readStatePointer(bundle string) (string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, statePointerFile))
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(b))
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || !strings.Contains(dir, "/vm/") {
		return "", fmt.Errorf("bundle %s: bad sandbox state pointer %q", bundle, dir)
	}
	return dir, nil
}

// readDiskPointer returns the disk directory recorded in a sandbox state
// dir.
func readDiskPointer(stateDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, diskPointerFile))
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(b))
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || filepath.Base(dir) != filepath.Base(stateDir) {
		return "", fmt.Errorf("sandbox %s: bad disk pointer %q", stateDir, dir)
	}
	return dir, nil
}

type exitRecord struct {
	Pid      int       `json:"pid"`
	Status   int       `json:"status"`
	ExitedAt time.Time `json:"exited_at"`
}

func writeExitRecord(bundle string, e exitRecord) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(bundle, exitRecordFile), b, 0o600)
}

func readExitRecord(bundle string) (exitRecord, error) {
	var e exitRecord
	b, err := os.ReadFile(filepath.Join(bundle, exitRecordFile))
	if err != nil {
		return e, err
	}
	return e, json.Unmarshal(b, &e)
}

func writePidRecord(bundle string, pid uint32) error {
	return atomicfile.Write(filepath.Join(bundle, pidRecordFile), []byte(strconv.FormatUint(uint64(pid), 10)+"\n"), 0o600)
}

func readPidRecord(bundle string) (uint32, error) {
	b, err := os.ReadFile(filepath.Join(bundle, pidRecordFile))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("bundle %s: bad pid record: %w", bundle, err)
	}
	return uint32(pid), nil
}
