package vmm

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestSpawnPassesNoInheritedDescriptor: a descriptor the process holds
// without close-on-exec (as the shim inherits its socket) does not reach a
// process started through startQEMU; its ExtraFiles do.
func TestSpawnPassesNoInheritedDescriptor(t *testing.T) {
	leak, err := syscall.Open(os.DevNull, syscall.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	cmd := exec.Command("sh", "-c", "ls /proc/$$/fd")
	var out strings.Builder
	cmd.Stdout = &out
	cmd.ExtraFiles = []*os.File{extra}
	if err := startQEMU(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	fds := strings.Fields(out.String())
	has := func(fd int) bool {
		for _, f := range fds {
			if f == strconv.Itoa(fd) {
				return true
			}
		}
		return false
	}
	if !has(3) {
		t.Fatalf("child's descriptors %v: ExtraFiles[0] is not fd 3", fds)
	}
	if leak != 3 && has(leak) {
		t.Fatalf("child's descriptors %v include the inherited fd %d", fds, leak)
	}
}
