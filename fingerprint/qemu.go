package fingerprint

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// The host side of the QEMU version: here rather than in vmm because the
// node cache remembers it across shims (nodecache.HostFacts), and the node
// cache sits below the VMM driver.

var qemuVersionRe = regexp.MustCompile(`version ([0-9]+\.[0-9]+\.[0-9]+)`)

// qemuVersionTimeout bounds `qemu --version`: a binary that hangs must not
// hold a restore.
const qemuVersionTimeout = 10 * time.Second

// QEMUVersion asks the QEMU binary at path its version ("7.2.19").
func QEMUVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), qemuVersionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	m := qemuVersionRe.FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", path, strings.TrimSpace(string(out)))
	}
	return m[1], nil
}
