//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stack"
	"github.com/cryo-runtime/cryo/stores"
)

// lazyNode restores lazily and lets pods ask for it: the default, spelt
// out where a test is about lazy restores.
func lazyNode(c *configs.Config) { c.Restore.Mode = configs.RestoreLazy }

// eagerNode restores eagerly and refuses lazy restores, for what only an
// eager restore promises (one materialization per node, a bad chunk
// refused before the VM starts).
func eagerNode(c *configs.Config) { c.Restore.Mode, c.Restore.AllowedModes = configs.RestoreEager, nil }

const lazyMode = "--annotation=cryo.dev/restore-mode=lazy"

// noLazyLeftovers fails if a pagefs mount or a RAM layer of the Env is left.
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

var (
	prefetchRe   = regexp.MustCompile(`msg="prefetch complete".*chunks=(\d+).*duration=(\S+).*sandbox=(\S+).*stored_bytes=(\d+)`)
	downloadedRe = regexp.MustCompile(`msg="prefetch complete".*cache_downloaded_bytes=(\d+).*sandbox=(\S+)`)
	storedRe     = regexp.MustCompile(`msg="checkpoint published".*stored_bytes=(\d+)`)
	beforeRunRe  = regexp.MustCompile(`msg="lazy restore: fetched before the guest ran".*cache_downloaded_bytes=(\d+).*chunk_bytes_fetched=(\d+).*ram_read_bytes=(\d+).*sandbox=(\S+)`)
)

// vmStopReason is why the VM stopped as the user of an exec it ended
// sees it: the exec exited 137 with the shim's notice as its last line of
// stderr, or ctr failed with the reason (the VM died while the exec was
// being created or started). Either way the reason must be there.
func vmStopReason(t *testing.T, out, errs string, err error) string {
	t.Helper()
	const stopped = "the sandbox vm stopped: "
	i := strings.LastIndex(errs, stopped)
	if err == nil || i < 0 {
		t.Fatalf("exec on a vm that stopped: %v, stdout %q, stderr %q: want a failure that says why", err, out, errs)
	}
	if code := harness.ExitCode(err); code != 137 && code != 1 {
		t.Fatalf("exec on a vm that stopped: exit %d (%v), want 137 (killed) or 1 (ctr's error)", code, err)
	}
	return strings.TrimSpace(errs[i+len(stopped):])
}

// containsAny reports whether s holds one of subs.
func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// bigFile writes 40 MiB of random data to the guest's RAM (/dev/shm, a 64 MiB tmpfs) and
// returns its md5.
func bigFile(t *testing.T, e *harness.Env, id string) string {
	t.Helper()
	out := e.MustCtr("task", "exec", "--exec-id", "big", id, "sh", "-c", "head -c 41943040 /dev/urandom > /dev/shm/big; md5sum /dev/shm/big")
	return strings.Fields(out)[0]
}

// clearNodeCache empties the node's blob cache (no shim of the Env uses it
// for a restore now), so the next restore fetches from the store.
func clearNodeCache(t *testing.T, e *harness.Env) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(e.Cfg.Snapshot.CacheDir, "blobs")); err != nil {
		t.Fatal(err)
	}
}

// TestLazyRestore: a pod restored with cryo.dev/restore-mode lazy has the
// checkpointed RAM and disk, QEMU maps the served file, the prefetch
// completes, and shutdown leaves no mount, layer or process.
//
// CRYO_LAZY_CHUNK_MIB sets the snapshot chunk size, to measure its effect
// on what a lazy restore fetches before the guest runs.
func TestLazyRestore(t *testing.T) {
	e := harness.Start(t, lazyNode, func(c *configs.Config) {
		if n, err := strconv.Atoi(os.Getenv("CRYO_LAZY_CHUNK_MIB")); err == nil {
			c.Snapshot.ChunkSizeMiB = n
		}
	})
	before := startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("lazy:v1"))

	// Eager first, from an empty node cache, for comparison (an eager
	// sandbox needs its materialized files, not the blob cache).
	clearNodeCache(t, e)
	t0 := time.Now()
	restore(t, e, "eg", e.StoreURL("lazy:v1"), "--annotation=cryo.dev/restore-mode=eager")
	if st := readState(t, e, "eg"); st.secret != before.secret {
		t.Fatalf("eager restore state %+v", st)
	}
	t.Logf("eager restore: first exec %v", time.Since(t0).Round(time.Millisecond))

	clearNodeCache(t, e)
	t0 = time.Now()
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
	b := beforeRunRe.FindStringSubmatch(e.LogTail(100000))
	if b == nil {
		t.Fatal("no log of what the lazy restore fetched before the guest ran")
	}
	t.Logf("lazy restore: first exec %v; before the guest ran: %s chunk bytes fetched, %s RAM bytes read; prefetch %s chunks, %s stored bytes in %s",
		firstExec.Round(time.Millisecond), b[2], b[3], m[1], m[4], m[2])
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatalf("prefetch fetched no chunk: %s", m[0])
	}
	// The guest writes to its disk and RAM after the restore.
	e.MustCtr("task", "exec", "--exec-id", "w", "lz", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/big bs=1M count=32 2>/dev/null; echo more > /data/file2; sync")
	if out := e.MustCtr("task", "exec", "--exec-id", "r", "lz", "cat", "/data/file", "/data/file2"); strings.Fields(out)[1] != "more" {
		t.Fatalf("disk after writes: %q", out)
	}
	idleShimMemory(t, "lz")

	for _, id := range []string{"src", "lz", "eg"} {
		e.MustCtr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// idleShimMemory: a lazily restored sandbox's shim gives back, once the
// sandbox idles, what its restore used: the decoded chunks it kept for
// page faults, go-fuse's request buffers and the decode buffers, some
// 60 MiB of anonymous memory right after the restore. At most
// idleShimAnonMiB stays (the shim's own heap and the runtime).
func idleShimMemory(t *testing.T, id string) {
	t.Helper()
	const idleShimAnonMiB = 16
	pids := stack.ProcsMatching("containerd-shim-cryo-v2", id)
	if len(pids) != 1 {
		t.Fatalf("shims of %s: %v, want one", id, pids)
	}
	anon := func() int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pids[0]))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^Anonymous:\s+(\d+) kB`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no Anonymous line in the shim's smaps_rollup:\n%s", b)
		}
		kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
		return kib >> 10
	}
	first, low := anon(), anon()
	start := time.Now()
	harness.WaitFor(60*time.Second, func() bool {
		low = min(low, anon())
		return low <= idleShimAnonMiB
	})
	t.Logf("shim of the lazy restore: %d MiB of anonymous memory after its first execs, %d MiB after %v idle", first, low, time.Since(start).Round(time.Second))
	if low > idleShimAnonMiB {
		t.Fatalf("the idle lazy sandbox's shim holds %d MiB of anonymous memory after 60 s (%d MiB after its first execs), want at most %d", low, first, idleShimAnonMiB)
	}
}

// ramChunks returns the digests of the stored chunks of ref's "ram" file.
func ramChunks(t *testing.T, url string) []string {
	t.Helper()
	ctx := t.Context()
	store, ref, err := stores.Open(ctx, url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Open(ctx, store, ref, snapshot.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fr, err := s.ServeFile(snapshot.FileRAM)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	var out []string
	for _, c := range fr.Chunks() {
		out = append(out, c.Stored.Digest.Encoded())
	}
	return out
}

// TestLazyFallbackCold: every RAM chunk corrupted in the store: the lazy
// restore fails before cont (QEMU dies loading its device state, which
// touches RAM); restore-fallback fail reports it and leaves nothing;
// restore-fallback cold boots the container. No mount or layer is left.
func TestLazyFallbackCold(t *testing.T) {
	e := harness.Start(t, lazyNode)
	startWorkload(t, e, "src")
	url := e.StoreURL("broken:v1")
	checkpoint(t, e, "src", url)
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	clearNodeCache(t, e)
	for _, d := range ramChunks(t, url) {
		p := filepath.Join(e.Dir, "store", "broken", "blobs", "sha256", d)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/3] ^= 0x10
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, err := e.Ctr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+url, lazyMode, harness.Image, "fail", "true")...)
	if err == nil || !strings.Contains(errs, "load") {
		t.Fatalf("lazy restore of a snapshot with corrupted RAM: %v\n%s\n%s", err, out, errs)
	}
	e.Ctr("c", "rm", "fail")
	noLazyLeftovers(t, e)
	out = e.MustCtr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+url, lazyMode, "--annotation", "cryo.dev/restore-fallback=cold",
		harness.Image, "cold", "sh", "-c", "echo booted-cold")...)
	if !strings.Contains(out, "booted-cold") {
		t.Fatalf("cold fallback output %q", out)
	}
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestLazyRefused: a node set to eager refuses the lazy annotation,
// naming it.
func TestLazyRefused(t *testing.T) {
	e := harness.Start(t, eagerNode)
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("nolazy:v1"))
	out, errs, err := e.Ctr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+e.StoreURL("nolazy:v1"), lazyMode, harness.Image, "x", "true")...)
	if err == nil || !strings.Contains(out+errs, "cryo.dev/restore-mode") {
		t.Fatalf("lazy restore on a node that does not allow it: %v\n%s\n%s", err, out, errs)
	}
}

// TestLazyClones: two lazy restores of one snapshot at once, each in its
// own shim, with an empty node cache: both have the checkpointed RAM, and
// together they download each byte of the snapshot once. gc while they run
// removes nothing they need.
func TestLazyClones(t *testing.T) {
	e := harness.Start(t, lazyNode)
	before := startWorkload(t, e, "src")
	sum := bigFile(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("clones:v1"))
	stored, _ := strconv.ParseInt(storedRe.FindStringSubmatch(e.LogTail(100000))[1], 10, 64)
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	clearNodeCache(t, e)

	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Go(func() { restore(t, e, id, e.StoreURL("clones:v1"), lazyMode) })
	}
	wg.Wait()
	for _, id := range []string{"a", "b"} {
		if st := readState(t, e, id); st.secret != before.secret || st.bootID != before.bootID {
			t.Fatalf("clone %s: state %+v, checkpointed %+v", id, st, before)
		}
	}
	var downloaded int64
	if !harness.WaitFor(60*time.Second, func() bool {
		ms := downloadedRe.FindAllStringSubmatch(e.LogTail(100000), -1)
		downloaded = 0
		for _, m := range ms {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			downloaded += n
		}
		return len(ms) == 2
	}) {
		t.Fatalf("both prefetches did not complete:\n%s", e.LogTail(40))
	}
	t.Logf("lazy clones: %d bytes downloaded by the two shims, snapshot stores %d", downloaded, stored)
	// Chunks once; manifest, config and signature-less refs are small.
	if downloaded > stored+1<<20 || downloaded < stored/2 {
		t.Fatalf("two clones downloaded %d bytes of a %d-byte snapshot: want each chunk once", downloaded, stored)
	}

	// The snapshot is untagged and the store collected with no grace while
	// the clones run: the node cache and the store keep what they read.
	chunks := ramChunks(t, e.StoreURL("clones:v1"))
	storeBlob := func(d string) string { return filepath.Join(e.Dir, "store", "clones", "blobs", "sha256", d) }
	if out, errs, err := e.Cryoctl("rm", e.StoreURL("clones:v1")); err != nil {
		t.Fatalf("cryoctl rm: %v\n%s\n%s", err, out, errs)
	}
	gc := func() {
		t.Helper()
		out, errs, err := e.Cryoctl("gc", "-o", "json", "--keep-materialized", "0s", "--grace", "0s", e.StoreURL("clones:v1"))
		var r struct{ CacheFreedBytes int64 }
		if err != nil || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("cryoctl gc: %v\n%s\n%s", err, out, errs)
		}
	}
	gc()
	for _, d := range chunks {
		if _, err := os.Stat(storeBlob(d)); err != nil {
			t.Fatalf("gc removed chunk %s of the snapshot two running lazy sandboxes read: %v", d, err)
		}
	}
	if leases, _ := filepath.Glob(filepath.Join(nodecache.SnapshotsDir(e.Cfg.Snapshot.CacheDir), ".*.blobs")); len(leases) != 1 {
		t.Fatalf("leases of the clones' snapshot in the node cache: %v", leases)
	}
	for _, id := range []string{"a", "b"} {
		if got := strings.Fields(e.MustCtr("task", "exec", "--exec-id", "md5", id, "md5sum", "/dev/shm/big"))[0]; got != sum {
			t.Fatalf("clone %s: md5 of the RAM file %s, checkpointed %s", id, got, sum)
		}
	}
	for _, id := range []string{"src", "a", "b"} {
		if id != "src" {
			e.MustCtr("task", "kill", "-s", "SIGKILL", id)
			waitStopped(t, e, id)
		}
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
	// Once no sandbox reads them, they go.
	gc()
	if _, err := os.Stat(storeBlob(chunks[0])); err == nil {
		t.Fatalf("chunk %s of the untagged snapshot survived gc once no sandbox used it", chunks[0])
	}
}

// TestLazyCorruptChunk: a chunk the store corrupts or truncates after the
// lazy sandbox runs (no prefetch, an empty node cache: the guest's
// untouched pages are still in the store) stops the VM when the guest
// touches it; the guest never reads a wrong byte, and the exec that touched
// it and the shim log name the chunk and the store.
func TestLazyCorruptChunk(t *testing.T) {
	e := harness.Start(t, lazyNode, func(c *configs.Config) { c.Restore.PrefetchWorkers = 0 })
	startWorkload(t, e, "src")
	sum := bigFile(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("bad:v1"))
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	clearNodeCache(t, e)
	restore(t, e, "lz", e.StoreURL("bad:v1"), lazyMode)
	readState(t, e, "lz")

	// Every blob the node has not fetched yet is corrupted in the store:
	// one byte flipped, or every other one cut to half its size.
	blobs, _ := filepath.Glob(filepath.Join(e.Dir, "store", "bad", "blobs", "sha256", "*"))
	var bad []string
	for _, p := range blobs {
		if _, err := os.Stat(filepath.Join(e.Cfg.Snapshot.CacheDir, "blobs", "blobs", "sha256", filepath.Base(p))); err == nil {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(bad)%2 == 0 {
			b[len(b)/2] ^= 0x40
		} else {
			b = b[:len(b)/2]
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, filepath.Base(p))
	}
	if len(bad) == 0 {
		t.Fatal("the lazy sandbox fetched every chunk before it ran: nothing left to corrupt")
	}
	out, errs, err := e.Ctr("task", "exec", "--exec-id", "md5", "lz", "md5sum", "/dev/shm/big")
	if err == nil && !strings.Contains(out, sum) {
		t.Fatalf("the guest read wrong bytes: md5 %q, checkpointed %s", out, sum)
	}
	t.Logf("exec after the corruption (%d blobs): %v %q %q", len(bad), err, out, errs)
	reason := vmStopReason(t, out, errs, err)
	if !strings.Contains(reason, "from file://") || !containsAny(reason, bad) {
		t.Fatalf("the exec's reason %q names neither a corrupted chunk %v nor its store", reason, bad)
	}
	waitStopped(t, e, "lz")
	log := e.LogTail(100000)
	named := false
	for _, d := range bad {
		named = named || strings.Contains(log, d)
	}
	if !strings.Contains(log, "a page could not be served") || !named || !strings.Contains(log, `store="file://`) {
		t.Fatalf("shim log does not name the failed chunk and its store:\n%s", e.LogTail(40))
	}
	for _, id := range []string{"src", "lz"} {
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestLazyLargeSnapshot: a guest with 192 MiB of random data in its page
// cache (about 390 MiB stored with its disk): the lazy restore fetches a fraction of the
// snapshot before the guest runs, an eager one all of it first. Both from
// an empty node cache; the log has the times.
func TestLazyLargeSnapshot(t *testing.T) {
	e := harness.Start(t, lazyNode)
	before := startWorkload(t, e, "src")
	e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c", "head -c 201326592 /dev/urandom > /data/fill; sync; cat /data/fill > /dev/null")
	checkpoint(t, e, "src", e.StoreURL("large:v1"))
	stored, _ := strconv.ParseInt(storedRe.FindStringSubmatch(e.LogTail(100000))[1], 10, 64)
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")

	clearNodeCache(t, e)
	t0 := time.Now()
	restore(t, e, "eg", e.StoreURL("large:v1"), "--annotation=cryo.dev/restore-mode=eager")
	readState(t, e, "eg")
	eager := time.Since(t0)

	clearNodeCache(t, e)
	t0 = time.Now()
	restore(t, e, "lz", e.StoreURL("large:v1"), lazyMode)
	if st := readState(t, e, "lz"); st.secret != before.secret {
		t.Fatalf("lazily restored %+v, checkpointed %+v", st, before)
	}
	lazy := time.Since(t0)
	b := beforeRunRe.FindStringSubmatch(e.LogTail(100000))
	if b == nil {
		t.Fatal("no log of what the lazy restore fetched before the guest ran")
	}
	fetched, _ := strconv.ParseInt(b[1], 10, 64)
	t.Logf("large snapshot (%d MiB stored): first exec eager %v, lazy %v; lazy downloaded %d MiB before the guest ran",
		stored>>20, eager.Round(time.Millisecond), lazy.Round(time.Millisecond), fetched>>20)
	if fetched > stored/2 {
		t.Fatalf("lazy restore downloaded %d of %d stored bytes before the guest ran", fetched, stored)
	}
	m := waitShimLog(t, e, prefetchRe, 120*time.Second)
	t.Logf("prefetch: %s chunks, %s stored bytes in %s", m[1], m[4], m[2])
	for _, id := range []string{"src", "eg", "lz"} {
		if id != "src" {
			e.MustCtr("task", "kill", "-s", "SIGKILL", id)
			waitStopped(t, e, id)
		}
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestLazyShimKilled: the shim serving a lazy sandbox's pages is killed:
// its QEMU dies with it (never hangs), and containerd's cleanup of the
// dead shim leaves no mount, layer or state behind.
func TestLazyShimKilled(t *testing.T) {
	e := harness.Start(t, lazyNode)
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("killed:v1"))
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")
	noLeftovers(t, e)

	restore(t, e, "lz", e.StoreURL("killed:v1"), lazyMode)
	readState(t, e, "lz")
	shims := e.ShimPids()
	if len(shims) != 1 || len(e.QEMUPids()) != 1 {
		t.Fatalf("shims %v, qemus %v: want one of each", shims, e.QEMUPids())
	}
	if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !harness.WaitFor(10*time.Second, func() bool { return len(e.QEMUPids()) == 0 }) {
		t.Fatalf("qemu %v still running 10 s after its page server was killed", e.QEMUPids())
	}
	// containerd runs the shim's delete action and drops the task.
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "ls")
		return err == nil && !strings.Contains(out, "RUNNING")
	}) {
		t.Fatalf("task lz still running after its shim was killed")
	}
	e.Ctr("task", "delete", "lz")
	e.MustCtr("c", "rm", "lz")
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}
