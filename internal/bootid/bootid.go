// Package bootid names the running boot of the host, so that node caches
// written without fsync can tell content written in this boot (safe: the
// page cache survives process crashes) from content a machine crash may
// have torn (written in an earlier boot).
package bootid

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

const path = "/proc/sys/kernel/random/boot_id"

// Get returns the kernel's boot id, a random UUID that changes on every
// boot. It is read once per process.
func Get() (string, error) { return get() }

var get = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if len(id) < 16 {
		return "", fmt.Errorf("boot id: %q in %s is too short", id, path)
	}
	return id, nil
})
