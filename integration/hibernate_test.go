//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	shimapi "github.com/cryo-runtime/cryo/shim/api/v1"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// hibernateNode allows lazy restores, with the 1 MiB chunks lazy RAM is
// measured with (pagefs/DESIGN.md).
func hibernateNode(c *configs.Config) {
	lazyNode(c)
	c.Snapshot.ChunkSizeMiB = 1
}

// storeBlobs is what a file store holds: blob count and bytes.
func storeBlobs(t *testing.T, e *harness.Env, name string) (int, int64) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.Dir, "store", name, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, de := range ents {
		if fi, err := de.Info(); err == nil {
			n += fi.Size()
		}
	}
	return len(ents), n
}

// devStateSize is the size of the device state of the snapshot at url.
func devStateSize(t *testing.T, url string) int64 {
	t.Helper()
	ctx := context.Background()
	st, ref, err := stores.Open(ctx, url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Open(ctx, st, ref, snapshot.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range s.Metadata.Files {
		if f.Name == snapshot.FileDevState {
			return f.Size
		}
	}
	t.Fatalf("%s has no device state", url)
	return 0
}

func stopCtr(t *testing.T, e *harness.Env, id string) {
	t.Helper()
	e.MustCtr("task", "kill", "-s", "SIGKILL", id)
	waitStopped(t, e, id)
	e.MustCtr("task", "delete", id)
	e.MustCtr("c", "rm", id)
}

func md5Of(t *testing.T, e *harness.Env, id, path string) string {
	t.Helper()
	out := e.MustCtr("task", "exec", "--exec-id", fmt.Sprintf("md5-%d", time.Now().UnixNano()), id, "md5sum", path)
	return strings.Fields(out)[0]
}

// TestHibernationChain (issue #14): boot, checkpoint, then five times
// restore lazily, write RAM (/dev/shm) and disk, checkpoint. Each
// checkpoint of a served sandbox uploads about what changed (counted in
// the store), carries no RAM in its device state, and the last restore
// has every generation's writes. A checkpoint to a store without the
// parent's blobs writes full chunks and says so.
func TestHibernationChain(t *testing.T) {
	e := harness.Start(t, hibernateNode)
	startWorkload(t, e, "g0")
	e.MustCtr("task", "exec", "--exec-id", "fill", "g0", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=32 2>/dev/null; sync")
	n0, b0 := storeBlobs0(t, e, "hib")
	booted := checkpointReport(t, e, "g0", e.StoreURL("hib:g0"))
	n1, b1 := storeBlobs(t, e, "hib")
	t.Logf("generation 0 (booted): pause %d ms, %d blobs, %d bytes added to the store, device state %d bytes",
		booted.PauseWindowMS, n1-n0, b1-b0, devStateSize(t, e.StoreURL("hib:g0")))
	sums := []string{md5Of(t, e, "g0", "/dev/shm/blob")}
	stopCtr(t, e, "g0")

	const gens = 5
	reports := []shimapi.CheckpointReport{booted}
	for g := 1; g <= gens; g++ {
		id := fmt.Sprintf("g%d", g)
		t0 := time.Now()
		restore(t, e, id, e.StoreURL(fmt.Sprintf("hib:g%d", g-1)), lazyMode)
		got := md5Of(t, e, id, "/dev/shm/blob")
		t.Logf("generation %d: restore of generation %d to first exec %v", g, g-1, time.Since(t0).Round(time.Millisecond))
		if got != sums[g-1] {
			t.Fatalf("generation %d restored /dev/shm/blob %s, generation %d wrote %s", g, got, g-1, sums[g-1])
		}
		// 1 MiB of RAM and a line of disk change.
		e.MustCtr("task", "exec", "--exec-id", "w", id, "sh", "-c", fmt.Sprintf(
			"dd if=/dev/urandom of=/dev/shm/blob bs=1M count=1 seek=%d conv=notrunc 2>/dev/null; echo gen-%d >> /data/gens; sync", g*3, g))
		sums = append(sums, md5Of(t, e, id, "/dev/shm/blob"))
		nb, bb := storeBlobs(t, e, "hib")
		r := checkpointReport(t, e, id, e.StoreURL(fmt.Sprintf("hib:g%d", g)))
		na, ba := storeBlobs(t, e, "hib")
		ds := devStateSize(t, e.StoreURL(fmt.Sprintf("hib:g%d", g)))
		t.Logf("generation %d (served): pause %d ms (booted %d), %d blobs, %d bytes added to the store, %d uploaded, %d deltas, device state %d bytes",
			g, r.PauseWindowMS, booted.PauseWindowMS, na-nb, ba-bb, r.UploadedBytes, r.DeltaChunks, ds)
		if ba-bb != r.UploadedBytes {
			t.Errorf("generation %d: the store received %d bytes, the checkpoint says %d", g, ba-bb, r.UploadedBytes)
		}
		// 1 MiB written, plus what the guest kernel and the workload dirty,
		// the device state and the disk's changed chunks: far less than
		// the first checkpoint.
		if ba-bb > 12<<20 || ba-bb > (b1-b0)/3 {
			t.Errorf("generation %d added %d bytes to the store (the booted checkpoint %d)", g, ba-bb, b1-b0)
		}
		if r.DeltaChunks == 0 {
			t.Errorf("generation %d stored no delta chunk", g)
		}
		if ds > 4<<20 {
			t.Errorf("generation %d: device state of %d bytes: RAM in the stream", g, ds)
		}
		if n := strings.Count(e.LogTail(100000), "checkpoint of served ram published"); n != g {
			t.Fatalf("generation %d: no served-RAM checkpoint in the log:\n%s", g, e.LogTail(40))
		}
		reports = append(reports, r)
		stopCtr(t, e, id)
	}

	// The last generation restores with every generation's writes.
	restore(t, e, "last", e.StoreURL(fmt.Sprintf("hib:g%d", gens)), lazyMode)
	if got := md5Of(t, e, "last", "/dev/shm/blob"); got != sums[gens] {
		t.Fatalf("last restore: /dev/shm/blob %s, want %s", got, sums[gens])
	}
	want := ""
	for g := 1; g <= gens; g++ {
		want += fmt.Sprintf("gen-%d\n", g)
	}
	if got := e.MustCtr("task", "exec", "--exec-id", "gens", "last", "cat", "/data/gens"); got != want {
		t.Fatalf("last restore: /data/gens %q, want %q", got, want)
	}

	// The store loses every blob (the node cache keeps what the prefetch
	// fetched): the next checkpoint writes full chunks and says so. The
	// last restore's own prefetch first (each generation's logged one).
	waitShimLog(t, e, regexp.MustCompile(`msg="prefetch complete".*sandbox=last\b`), 120*time.Second)
	blobs := filepath.Join(e.Dir, "store", "hib", "blobs", "sha256")
	ents, _ := os.ReadDir(blobs)
	for _, de := range ents {
		if err := os.Remove(filepath.Join(blobs, de.Name())); err != nil {
			t.Fatal(err)
		}
	}
	full := checkpointReport(t, e, "last", e.StoreURL("hib:full"))
	if !strings.Contains(e.LogTail(100000), "parent's blobs missing: full chunks") {
		t.Errorf("checkpoint to a store without the parent: the log does not say so:\n%s", e.LogTail(40))
	}
	if full.UploadedBytes < 8*reports[gens].UploadedBytes || full.DeltaChunks != 0 {
		t.Errorf("checkpoint to a store without the parent's blobs uploaded %d bytes, %d deltas (generation %d: %d)",
			full.UploadedBytes, full.DeltaChunks, gens, reports[gens].UploadedBytes)
	}
	restore(t, e, "other", e.StoreURL("hib:full"), lazyMode)
	if got := md5Of(t, e, "other", "/dev/shm/blob"); got != sums[gens] {
		t.Fatalf("restore from the full checkpoint: /dev/shm/blob %s, want %s", got, sums[gens])
	}
	for _, id := range []string{"last", "other"} {
		stopCtr(t, e, id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// storeBlobs0 is storeBlobs of a store that may not exist yet.
func storeBlobs0(t *testing.T, e *harness.Env, name string) (int, int64) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(e.Dir, "store", name, "blobs")); os.IsNotExist(err) {
		return 0, 0
	}
	return storeBlobs(t, e, name)
}

// TestHibernationClonesAndGC (issue #14): two clones of one parent,
// checkpointed at the same time into one store, share the parent's blobs;
// once the older snapshots are removed and the store collected, the
// newest one still restores and the store holds only the blobs it names.
func TestHibernationClonesAndGC(t *testing.T) {
	e := harness.Start(t, hibernateNode)
	startWorkload(t, e, "src")
	e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=32 2>/dev/null; sync")
	first := checkpointReport(t, e, "src", e.StoreURL("clones:g0"))
	stopCtr(t, e, "src")

	clones := []string{"a", "b"}
	sums := map[string]string{}
	for i, id := range clones {
		restore(t, e, id, e.StoreURL("clones:g0"), lazyMode)
		e.MustCtr("task", "exec", "--exec-id", "w", id, "sh", "-c", fmt.Sprintf(
			"dd if=/dev/urandom of=/dev/shm/blob bs=1M count=1 seek=%d conv=notrunc 2>/dev/null; echo %s > /data/who; sync", 4+i*8, id))
		sums[id] = md5Of(t, e, id, "/dev/shm/blob")
	}
	nb, bb := storeBlobs(t, e, "clones")
	reports := make([]shimapi.CheckpointReport, len(clones))
	var wg sync.WaitGroup
	for i, id := range clones {
		wg.Add(1)
		go func() { defer wg.Done(); reports[i] = checkpointReport(t, e, id, e.StoreURL("clones:"+id)) }()
	}
	wg.Wait()
	na, ba := storeBlobs(t, e, "clones")
	t.Logf("two clones checkpointed at once: %d blobs, %d bytes added (first checkpoint %d bytes)", na-nb, ba-bb, first.UploadedBytes)
	for i, r := range reports {
		if r.UploadedBytes > 12<<20 || r.DeltaChunks == 0 {
			t.Errorf("clone %s uploaded %d bytes, %d deltas: it did not reuse the parent", clones[i], r.UploadedBytes, r.DeltaChunks)
		}
	}
	if ba-bb > first.UploadedBytes/3 {
		t.Errorf("two clones added %d bytes to the store, the parent is %d", ba-bb, first.UploadedBytes)
	}
	for _, id := range clones {
		stopCtr(t, e, id)
	}

	// a's child, then everything but it removed and collected.
	restore(t, e, "a2", e.StoreURL("clones:a"), lazyMode)
	e.MustCtr("task", "exec", "--exec-id", "w", "a2", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=1 seek=20 conv=notrunc 2>/dev/null; sync")
	sum := md5Of(t, e, "a2", "/dev/shm/blob")
	checkpointReport(t, e, "a2", e.StoreURL("clones:a2"))
	stopCtr(t, e, "a2")
	for _, tag := range []string{"g0", "a", "b"} {
		if out, errs, err := e.Cryoctl("rm", e.StoreURL("clones:"+tag)); err != nil {
			t.Fatalf("cryoctl rm %s: %v\n%s%s", tag, err, out, errs)
		}
	}
	if out, errs, err := e.Cryoctl("gc", "--grace", "0s", "--no-cache", e.StoreURL("clones")); err != nil {
		t.Fatalf("cryoctl gc: %v\n%s%s", err, out, errs)
	} else {
		t.Logf("gc: %s", strings.TrimSpace(out))
	}
	ctx := context.Background()
	st, ref, err := stores.Open(ctx, e.StoreURL("clones:a2"), stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Open(ctx, st, ref, snapshot.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{s.Descriptor.Digest.String(): true, s.Manifest.Config.Digest.String(): true}
	for _, l := range s.Manifest.Layers {
		named[l.Digest.String()] = true
	}
	if n, _ := storeBlobs(t, e, "clones"); n != len(named) {
		t.Errorf("after gc the store holds %d blobs, the kept snapshot names %d", n, len(named))
	}
	if out, errs, err := e.Cryoctl("verify", e.StoreURL("clones:a2")); err != nil {
		t.Fatalf("cryoctl verify after gc: %v\n%s%s", err, out, errs)
	}
	restore(t, e, "back", e.StoreURL("clones:a2"), lazyMode)
	if got := md5Of(t, e, "back", "/dev/shm/blob"); got != sum {
		t.Fatalf("restore after gc: /dev/shm/blob %s, want %s", got, sum)
	}
	if got := strings.TrimSpace(e.MustCtr("task", "exec", "--exec-id", "who", "back", "cat", "/data/who")); got != "a" {
		t.Fatalf("restore after gc: /data/who %q, want a", got)
	}
	stopCtr(t, e, "back")
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestHibernationBeforePrefetch (issue #14): a served sandbox whose RAM
// was never prefetched (prefetch off: the guest's faults fetched what it
// touched) checkpoints incrementally; the chunks it wrote are read from
// the store during the checkpoint, and the snapshot restores.
func TestHibernationBeforePrefetch(t *testing.T) {
	e := harness.Start(t, hibernateNode, func(c *configs.Config) { c.Restore.PrefetchWorkers = 0 })
	startWorkload(t, e, "src")
	e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=32 2>/dev/null; sync")
	first := checkpointReport(t, e, "src", e.StoreURL("nopf:g0"))
	stopCtr(t, e, "src")
	// Every later read comes from the store: the node cache is emptied.
	if err := os.RemoveAll(filepath.Join(e.Cfg.Snapshot.CacheDir, "blobs")); err != nil {
		t.Fatal(err)
	}
	restore(t, e, "g1", e.StoreURL("nopf:g0"), lazyMode)
	e.MustCtr("task", "exec", "--exec-id", "w", "g1", "sh", "-c",
		"dd if=/dev/urandom of=/dev/shm/blob bs=1M count=1 seek=9 conv=notrunc 2>/dev/null; echo one >> /data/gens; sync")
	sum := md5Of(t, e, "g1", "/dev/shm/blob")
	r := checkpointReport(t, e, "g1", e.StoreURL("nopf:g1"))
	if strings.Contains(e.LogTail(100000), "prefetch complete") {
		t.Fatal("a prefetch ran: the test needs it off")
	}
	if r.UploadedBytes > first.UploadedBytes/3 || r.DeltaChunks == 0 {
		t.Errorf("checkpoint before any prefetch uploaded %d bytes, %d deltas (first %d)", r.UploadedBytes, r.DeltaChunks, first.UploadedBytes)
	}
	stopCtr(t, e, "g1")
	restore(t, e, "g2", e.StoreURL("nopf:g1"), lazyMode)
	if got := md5Of(t, e, "g2", "/dev/shm/blob"); got != sum {
		t.Fatalf("restore: /dev/shm/blob %s, want %s", got, sum)
	}
	if got := e.MustCtr("task", "exec", "--exec-id", "gens", "g2", "cat", "/data/gens"); got != "one\n" {
		t.Fatalf("restore: /data/gens %q", got)
	}
	stopCtr(t, e, "g2")
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}
