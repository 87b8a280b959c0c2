//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
)

// lazyNode lets pods ask for lazy restores.
func lazyNode(c *configs.Config) { c.Restore.AllowedModes = []string{configs.RestoreLazy} }

const lazyMode = "--annotation=cryo.dev/restore-mode=lazy"

// noMounts fails if a pagefs mount or a RAM layer of the Env is left.
func noLazyLeftovers(t *testing.T, e *harness.Env) {
	t.Helper()
	b, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "cryo-pagefs") && strings.Contains(l, e.StateRoot) {
			t.Errorf("pagefs mount left: %s", l)
		}
	}
	layers, _ := filepath.Glob(filepath.Join(e.Cfg.Hypervisor.MemoryDir, "cryo-*.layer*"))
	for _, l := range layers {
		t.Errorf("ram layer left: %s", l)
	}
}

// waitShimLog waits for re to match the containerd (and shim) log.
func waitShimLog(t *testing.T, e *harness.Env, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	var m []string
	if !harness.WaitFor(timeout, func() bool {
		m = re.FindStringSubmatch(e.LogTail(100000))
		return m != nil
	}) {
		t.Fatalf("log never matched %s:\n%s", re, e.LogTail(40))
	}
	return m
}

var prefetchRe = regexp.MustCompile(`msg="prefetch complete".*chunks=(\d+).*duration=(\S+).*stored_bytes=(\d+)`)

// TestLazyRestore: a pod restored with cryo.dev/restore-mode lazy has the
// checkpointed RAM and disk, QEMU maps the served file, the prefetch
// completes, and shutdown leaves no mount, layer or process.
func TestLazyRestore(t *testing.T) {
	e := harness.Start(t, lazyNode)
	before := startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("lazy:v1"))

	t0 := time.Now()
	restore(t, e, "lz", e.StoreURL("lazy:v1"), lazyMode)
	after := readState(t, e, "lz")
	firstExec := time.Since(t0)
	if after.bootID != before.bootID || after.secret != before.secret || after.file != "on-rootfs" || after.counter < before.counter {
		t.Fatalf("lazily restored state %+v, checkpointed %+v", after, before)
	}
	waitAdvance(t, e, "lz", after.counter)
	if !strings.Contains(e.LogTail(100000), `mode=lazy`) {
		t.Fatalf("restore was not lazy:\n%s", e.LogTail(40))
	}
	m := waitShimLog(t, e, prefetchRe, 60*time.Second)
	t.Logf("lazy restore: first exec %v; prefetch %s chunks, %s stored bytes in %s", firstExec.Round(time.Millisecond), m[1], m[3], m[2])
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatalf("prefetch fetched no chunk: %s", m[0])
	}
	// The guest writes to its disk and RAM after the restore.
	e.MustCtr("task", "exec", "--exec-id", "w", "lz", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/big bs=1M count=32 2>/dev/null; echo more > /data/file2; sync")
	if out := e.MustCtr("task", "exec", "--exec-id", "r", "lz", "cat", "/data/file", "/data/file2"); strings.Fields(out)[1] != "more" {
		t.Fatalf("disk after writes: %q", out)
	}

	for _, id := range []string{"src", "lz"} {
		e.MustCtr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestLazyRefused: a node that does not allow lazy restores refuses the
// annotation, naming it.
func TestLazyRefused(t *testing.T) {
	e := harness.Start(t)
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("nolazy:v1"))
	out, errs, err := e.Ctr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+e.StoreURL("nolazy:v1"), lazyMode, harness.Image, "x", "true")...)
	if err == nil || !strings.Contains(out+errs, "cryo.dev/restore-mode") {
		t.Fatalf("lazy restore on a node that does not allow it: %v\n%s\n%s", err, out, errs)
	}
}
