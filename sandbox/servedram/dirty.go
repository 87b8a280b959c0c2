package servedram

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/log"
)

// A served RAM is dirty page cache of a FUSE file, so the kernel's global
// dirty limits apply to it (an owned RAM on tmpfs is not counted): once
// the node's dirty pages pass the background threshold, the flusher
// writes guest RAM back through the server while the guest runs, and a
// guest rewriting its RAM slows to the server's write-back speed (848
// against 3028 MiB/s for a 4 GiB writer at the kernel's defaults,
// docs/performance.md). The shim does not change the node's sysctls (they
// are every writer's): packaging/sysctl/90-cryo-dirty.conf raises them,
// and a sandbox started with less headroom than its RAM says so once.

// vmstatPath is the kernel's own computation of the thresholds
// (global_dirty_limits(), from vm.dirty_* and the dirtyable memory now).
const vmstatPath = "/proc/vmstat"

// sysctlFile is the node setting the warning points to.
const sysctlFile = "/etc/sysctl.d/90-cryo-dirty.conf"

// dirtyThresholds are the node's global dirty thresholds now, in bytes.
type dirtyThresholds struct {
	// Background: above it the flusher writes dirty pages back, served
	// guest RAM among them, while the guest runs.
	Background int64
	// Throttle: the hard limit; writers are throttled from halfway
	// between the two.
	Throttle int64
}

// readDirtyThresholds reads nr_dirty_background_threshold and
// nr_dirty_threshold (pages) from a /proc/vmstat. The kernel computes
// them when the file is read: vm.dirty_background_bytes (or _ratio of the
// free and file-backed memory) and vm.dirty_bytes (or _ratio), the
// background one at most half the other.
func readDirtyThresholds(r io.Reader) (dirtyThresholds, error) {
	var t dirtyThresholds
	var seen int
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		var dst *int64
		switch {
		case !ok:
			continue
		case name == "nr_dirty_background_threshold":
			dst = &t.Background
		case name == "nr_dirty_threshold":
			dst = &t.Throttle
		default:
			continue
		}
		pages, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		if err != nil || pages < 0 {
			return t, fmt.Errorf("vmstat %s %q: not a page count", name, val)
		}
		*dst = pages * int64(os.Getpagesize())
		seen++
	}
	if err := sc.Err(); err != nil {
		return t, err
	}
	if seen != 2 {
		return t, fmt.Errorf("vmstat: nr_dirty_background_threshold or nr_dirty_threshold missing")
	}
	return t, nil
}

// dirtyHeadroomWarning is the warning for a served RAM of size bytes
// under thresholds t, "" when the background threshold holds the whole
// RAM dirty. It compares with one RAM, not the node's sum: the check is
// a hint at start, the node's other served guests and disk writers share
// the same thresholds.
func dirtyHeadroomWarning(size int64, t dirtyThresholds) string {
	if t.Background >= size {
		return ""
	}
	return fmt.Sprintf("served ram: the node's dirty background threshold (%d MiB, throttle %d MiB) is below this guest's RAM (%d MiB): "+
		"a guest that rewrites more than that between checkpoints is written back while it runs and slows down; "+
		"raise vm.dirty_background_ratio and vm.dirty_ratio (%s, docs/performance.md)",
		t.Background>>20, t.Throttle>>20, size>>20, sysctlFile)
}

// checkDirtyLimits logs one warning when the node's dirty limits cannot
// hold a served RAM of size bytes dirty.
func checkDirtyLimits(ctx context.Context, size int64) {
	f, err := os.Open(vmstatPath)
	if err != nil {
		log.G(ctx).WithError(err).Debug("served ram: dirty limits not checked")
		return
	}
	defer f.Close()
	t, err := readDirtyThresholds(f)
	if err != nil {
		log.G(ctx).WithError(err).Debug("served ram: dirty limits not checked")
		return
	}
	if w := dirtyHeadroomWarning(size, t); w != "" {
		log.G(ctx).Warn(w)
	}
}
