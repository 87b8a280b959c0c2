//go:build integration

package integration

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stack"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// TestLazyCheckpointDuringPrefetch (issues #13 and #14): a sandbox
// restored lazily from S3 over a slow link (tc, the store's port only) is
// checkpointed while its prefetch still runs: the checkpoint is
// incremental (a served RAM's), the prefetch then completes, and the new
// snapshot restores with the state of both generations.
func TestLazyCheckpointDuringPrefetch(t *testing.T) {
	s3 := storetest.StartS3(t)
	e := harness.Start(t, s3Node(s3), func(c *configs.Config) {
		c.Restore.PrefetchWorkers = 1
		hibernateNode(c)
	})
	startWorkload(t, e, "src")
	e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=32 2>/dev/null")
	sum0 := md5Of(t, e, "src", "/dev/shm/blob")
	parent := "s3://" + s3.Bucket + "/agents/prefetch:v1"
	checkpoint(t, e, "src", parent)
	stopCtr(t, e, "src")
	clearNodeCache(t, e)

	// The 32 MiB blob alone takes about 14 s to prefetch: the restore and
	// the exec before the checkpoint take a few seconds under TCG alone,
	// more under the other lanes' load, which does not slow the link.
	link, err := stack.ShapeEndpoint(s3.Endpoint, "20mbit")
	if err != nil {
		t.Fatal(err)
	}
	defer link.Remove()

	// The blob is left to the prefetch: generation 1 writes its own file.
	restore(t, e, "g1", parent, lazyMode)
	e.MustCtr("task", "exec", "--exec-id", "w", "g1", "sh", "-c", "head -c 1048576 /dev/urandom > /dev/shm/g1; echo gen-1 >> /data/gens; sync")
	// The checkpoint starts while the prefetch runs (it may end during
	// the checkpoint, which reads parent chunks over the same link).
	if strings.Contains(e.LogTail(100000), `msg="prefetch complete"`) {
		t.Fatal("the prefetch completed before the checkpoint: the link is too fast for this test")
	}
	child := "s3://" + s3.Bucket + "/agents/prefetch:g1" // the parent's store: its blobs are reused
	r := checkpointReport(t, e, "g1", child)
	log := e.LogTail(100000)
	if !strings.Contains(log, "checkpoint of served ram published") {
		t.Fatalf("the checkpoint during prefetch was not a served RAM's:\n%s", e.LogTail(40))
	}
	t.Logf("checkpoint during prefetch: %d bytes uploaded, %d deltas, pause %d ms", r.UploadedBytes, r.DeltaChunks, r.PauseWindowMS)
	if r.DeltaChunks == 0 || r.UploadedBytes > 16<<20 {
		t.Errorf("checkpoint during prefetch uploaded %d bytes with %d deltas: not incremental", r.UploadedBytes, r.DeltaChunks)
	}
	if ws := workingSet(t, e, child); len(ws) == 0 {
		t.Error("the served checkpoint recorded no working set")
	} else {
		t.Logf("working set: %d ram chunks, first %v", len(ws), ws[:min(8, len(ws))])
	}
	sum1 := md5Of(t, e, "g1", "/dev/shm/g1") // after the checkpoint: its own time is the prefetch's
	waitShimLog(t, e, regexp.MustCompile(`msg="prefetch complete"`), 5*time.Minute)
	stopCtr(t, e, "g1")
	if err := link.Remove(); err != nil {
		t.Fatal(err)
	}

	restore(t, e, "g2", child, lazyMode)
	// Its prefetch takes the recorded working set first.
	waitShimLog(t, e, regexp.MustCompile(`msg="prefetch complete".*sandbox=g2.*working_set_chunks=[1-9]`), 2*time.Minute)
	if got := md5Of(t, e, "g2", "/dev/shm/blob"); got != sum0 {
		t.Fatalf("generation 2 restored blob %s, generation 0 wrote %s", got, sum0)
	}
	if got := md5Of(t, e, "g2", "/dev/shm/g1"); got != sum1 {
		t.Fatalf("generation 2 restored /dev/shm/g1 %s, generation 1 wrote %s", got, sum1)
	}
	if out := e.MustCtr("task", "exec", "--exec-id", "gens", "g2", "cat", "/data/gens"); !strings.Contains(out, "gen-1") {
		t.Fatalf("generation 2's disk: %q, want generation 1's line", out)
	}
	stopCtr(t, e, "g2")
	noLazyLeftovers(t, e)
}

// workingSet is the working set recorded in the snapshot at url.
func workingSet(t *testing.T, e *harness.Env, url string) []int64 {
	t.Helper()
	ctx := context.Background()
	st, ref, err := stores.Open(ctx, url, e.Cfg.Stores.FetchOptions())
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Open(ctx, st, ref, snapshot.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Metadata.WorkingSet
}
