//go:build integration

package integration

import (
	"encoding/json"
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
	t.Logf("checkpoint %s to %s: %d raw, %d stored, %d uploaded bytes, %d of %d chunks", id, to,
		r.RawBytes, r.StoredBytes, r.UploadedBytes, r.ChunksUploaded, r.Chunks)
	return r
}

// TestCheckpointDelta: after a few MiB of guest RAM changed, a second
// checkpoint of the sandbox to the same store uploads deltas of the
// changed pages (issue #6), and a restore from it sees the changed data.
func TestCheckpointDelta(t *testing.T) {
	e := harness.Start(t)
	startWorkload(t, e, "src")
	first := checkpointReport(t, e, "src", e.StoreURL("delta:v1"))

	// 8 MiB of new random data in a guest tmpfs: guest RAM only.
	const changedMiB = 8
	sum := e.MustCtr("task", "exec", "--exec-id", "dd", "src", "sh", "-c",
		"dd if=/dev/urandom of=/dev/shm/blob bs=1M count=8 2>/dev/null && md5sum /dev/shm/blob")
	second := checkpointReport(t, e, "src", e.StoreURL("delta:v2"))
	share := float64(second.UploadedBytes) / float64(first.UploadedBytes)
	t.Logf("second checkpoint uploaded %.1f%% of the first's bytes (%d MiB of guest RAM changed)", 100*share, changedMiB)
	if second.UploadedBytes > 3*changedMiB<<20 || share > 0.25 {
		t.Fatalf("second checkpoint uploaded %d bytes (%.1f%% of the first's %d) after %d MiB changed",
			second.UploadedBytes, 100*share, first.UploadedBytes, changedMiB)
	}
	if !strings.Contains(e.LogTail(100000), "delta_chunks=") {
		t.Errorf("the shim did not log its delta chunks")
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
