//go:build integration

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/integration/harness"
	shimapi "github.com/cryo-runtime/cryo/shim/api/v1"
)

// checkpointReport checkpoints id to to and returns the shim's report.
func checkpointReport(t *testing.T, e *harness.Env, id, to string) shimapi.CheckpointReport {
	t.Helper()
	out, errs, err := e.Cryoctl("checkpoint", "-o", "json", "-n", e.Namespace, id, "--to", to)
	if err != nil {
		t.Fatalf("cryoctl checkpoint %s: %v\n%s\n%s\ncontainerd log:\n%s", id, err, out, errs, e.LogTail(30))
	}
	var r shimapi.CheckpointReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("cryoctl checkpoint -o json: %v: %q", err, out)
	}
	t.Logf("checkpoint %s to %s: %d raw, %d stored, %d uploaded bytes, %d of %d chunks, %d as deltas", id, to,
		r.RawBytes, r.StoredBytes, r.UploadedBytes, r.ChunksUploaded, r.Chunks, r.DeltaChunks)
	return r
}

// TestCheckpointDelta: after a few MiB of guest RAM changed, a second
// checkpoint of the sandbox to the same store uploads deltas of the
// changed pages (issue #6), far less than the first and than whole
// changed chunks, and a restore from it sees the changed data.
func TestCheckpointDelta(t *testing.T) {
	e := harness.Start(t)
	startWorkload(t, e, "src")
	// 48 MiB of random data in a guest tmpfs (guest RAM; the
	// container's /dev/shm holds 64), as in the measurement.
	e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c",
		"dd if=/dev/urandom of=/dev/shm/blob bs=1M count=48 2>&1")
	first := checkpointReport(t, e, "src", e.StoreURL("delta:v1"))
	if first.DeltaChunks != 0 {
		t.Errorf("first checkpoint reports %d delta chunks, want 0", first.DeltaChunks)
	}

	idx, err := filepath.Glob(filepath.Join(e.StateRoot, "vm", "*", "pageindex.json"))
	if err != nil || len(idx) != 1 {
		t.Fatalf("page index in the sandbox state dir: %v, %v", idx, err)
	}
	if st, err := os.Stat(idx[0]); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("page index %s: %v, %v", idx[0], st, err)
	}

	// Rewrite 1 MiB in every 16 in place: 3 MiB, the same guest pages.
	sum := e.MustCtr("task", "exec", "--exec-id", "dd", "src", "sh", "-c",
		"for i in $(seq 0 16 47); do dd if=/dev/urandom of=/dev/shm/blob bs=1M count=1 seek=$i conv=notrunc 2>/dev/null; done; md5sum /dev/shm/blob")
	second := checkpointReport(t, e, "src", e.StoreURL("delta:v2"))
	share := float64(second.UploadedBytes) / float64(first.UploadedBytes)
	t.Logf("second checkpoint uploaded %.1f%% of the first's bytes", 100*share)
	if second.DeltaChunks == 0 || second.DeltaChunks > second.ChunksUploaded {
		t.Errorf("second checkpoint reports %d delta chunks of %d uploaded: want some, at most all uploaded",
			second.DeltaChunks, second.ChunksUploaded)
	}
	if share > 0.10 {
		t.Fatalf("second checkpoint uploaded %d bytes, %.1f%% of the first's %d: want <= 10%%",
			second.UploadedBytes, 100*share, first.UploadedBytes)
	}

	// Without the index the same change costs whole chunks.
	if err := os.Remove(idx[0]); err != nil {
		t.Fatal(err)
	}
	full := checkpointReport(t, e, "src", e.StoreURL("delta:v3"))
	if full.DeltaChunks != 0 {
		t.Errorf("checkpoint without a page index reports %d delta chunks, want 0", full.DeltaChunks)
	}
	t.Logf("without the page index: %.1f%% of the first's bytes", 100*float64(full.UploadedBytes)/float64(first.UploadedBytes))
	if full.UploadedBytes < 2*second.UploadedBytes {
		t.Errorf("deltas saved little: %d bytes uploaded with the index, %d without", second.UploadedBytes, full.UploadedBytes)
	}

	restore(t, e, "back", e.StoreURL("delta:v2"))
	if got := e.MustCtr("task", "exec", "--exec-id", "sum", "back", "md5sum", "/dev/shm/blob"); strings.Fields(got)[0] != strings.Fields(sum)[0] {
		t.Fatalf("restored /dev/shm/blob has md5 %q, checkpointed %q", got, sum)
	}
	for _, id := range []string{"src", "back"} {
		e.MustCtr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
}
