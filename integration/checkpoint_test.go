//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/nodecache"
)

// workload keeps a counter and a random secret only in RAM (a shell
// variable and /dev/shm, a tmpfs) and a file on its rootfs.
const workload = `head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > /dev/shm/secret
echo on-rootfs > /data/file; sync
i=0; while true; do i=$((i+1)); echo $i > /dev/shm/counter.new; mv /dev/shm/counter.new /dev/shm/counter; sleep 0.1; done`

type guestState struct {
	bootID, secret, file string
	counter              int
}

func readState(t *testing.T, e *harness.Env, id string) guestState {
	t.Helper()
	out := e.MustCtr("task", "exec", "--exec-id", fmt.Sprintf("st%d", time.Now().UnixNano()), id, "sh", "-c",
		"cat /proc/sys/kernel/random/boot_id /dev/shm/secret; echo; cat /data/file /dev/shm/counter")
	f := strings.Fields(out)
	if len(f) != 4 {
		t.Fatalf("state of %s: %q", id, out)
	}
	n, err := strconv.Atoi(f[3])
	if err != nil {
		t.Fatalf("counter of %s: %q", id, out)
	}
	return guestState{bootID: f[0], secret: f[1], file: f[2], counter: n}
}

func startWorkload(t *testing.T, e *harness.Env, id string) guestState {
	t.Helper()
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sh", "-c", workload)...)
	var st guestState
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "exec", "--exec-id", "w"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), id, "cat", "/dev/shm/counter")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return err == nil && n >= 15
	}) {
		t.Fatalf("workload %s did not start counting", id)
	}
	st = readState(t, e, id)
	return st
}

var digestRe = regexp.MustCompile(`@(sha256:[0-9a-f]{64})`)

func checkpoint(t *testing.T, e *harness.Env, id, to string, extra ...string) string {
	t.Helper()
	out, errs, err := e.Cryoctl(append([]string{"checkpoint", "-n", e.Namespace, id, "--to", to}, extra...)...)
	if err != nil {
		t.Fatalf("cryoctl checkpoint %s: %v\n%s\n%s\ncontainerd log:\n%s", id, err, out, errs, e.LogTail(30))
	}
	m := digestRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("cryoctl checkpoint printed no digest: %s", out)
	}
	t.Logf("checkpoint %s: %s", id, strings.TrimSpace(out))
	return m[1]
}

func restore(t *testing.T, e *harness.Env, id, from string, extra ...string) {
	t.Helper()
	args := append([]string{"-d", "--annotation", "cryo.dev/restore-from=" + from}, extra...)
	e.MustCtr(e.RunArgs(append(args, harness.Image, id, "sh", "-c", "echo booted-cold; sleep 1000")...)...)
}

// TestCheckpointRestore: a restored container continues the checkpointed
// workload: same RAM (counter, secret), same files, same boot: a restore,
// not a reboot. The source keeps running. A checkpoint of the restored
// sandbox restores again (a chain).
func TestCheckpointRestore(t *testing.T) {
	e := harness.Start(t)
	before := startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("demo:v1"))

	restore(t, e, "copy", e.StoreURL("demo:v1"))
	after := readState(t, e, "copy")
	if after.bootID != before.bootID || after.secret != before.secret || after.file != "on-rootfs" {
		t.Fatalf("restored state %+v, checkpointed %+v", after, before)
	}
	if after.counter < before.counter {
		t.Fatalf("counter went back: %d after restore, %d before the checkpoint", after.counter, before.counter)
	}
	if ps := e.MustCtr("task", "ps", "copy"); len(strings.Split(strings.TrimSpace(ps), "\n")) < 2 {
		t.Fatalf("task ps of the restored container: %q", ps)
	}
	// The restored task's pid is its own VM's, not the source's.
	if src, cp := ctrTaskPid(t, e, "src"), ctrTaskPid(t, e, "copy"); cp == src || !slices.Contains(e.QEMUPids(), cp) {
		t.Fatalf("restored task pid %d (source %d), qemu pids %v: want a QEMU of its own", cp, src, e.QEMUPids())
	}
	// the source runs on
	waitAdvance(t, e, "src", before.counter)

	// A chain: checkpoint the restored sandbox, restore that.
	time.Sleep(500 * time.Millisecond)
	mid := readState(t, e, "copy")
	checkpoint(t, e, "copy", e.StoreURL("demo:v2"))
	restore(t, e, "chain", e.StoreURL("demo:v2"))
	chain := readState(t, e, "chain")
	if chain.bootID != before.bootID || chain.secret != before.secret || chain.counter < mid.counter {
		t.Fatalf("chained restore state %+v, checkpointed %+v", chain, mid)
	}

	for _, id := range []string{"src", "copy", "chain"} {
		e.MustCtr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
}

// TestCheckpointExit: --leave-running=false stops the source; its snapshot
// restores.
func TestCheckpointExit(t *testing.T) {
	e := harness.Start(t)
	before := startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("exit:v1"), "--leave-running=false")
	waitStopped(t, e, "src")
	restore(t, e, "back", e.StoreURL("exit:v1"))
	if st := readState(t, e, "back"); st.secret != before.secret || st.counter < before.counter {
		t.Fatalf("restored %+v, checkpointed %+v", st, before)
	}
}

// TestConcurrentRestores: two containers restored from one snapshot at the
// same time both run, do not share writes, draw different randomness, and
// the node materializes the snapshot once (an eager node: lazy clones are
// TestLazyClones).
func TestConcurrentRestores(t *testing.T) {
	e := harness.Start(t, eagerNode)
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("fan:v1"))
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); restore(t, e, id, e.StoreURL("fan:v1")) }()
	}
	wg.Wait()
	e.MustCtr("task", "exec", "--exec-id", "w", "a", "sh", "-c", "echo only-in-a > /data/x; sync")
	if out, _, err := e.Ctr("task", "exec", "--exec-id", "r", "b", "cat", "/data/x"); err == nil {
		t.Fatalf("b sees a's write: %q", out)
	}
	rnd := func(id string) string {
		return e.MustCtr("task", "exec", "--exec-id", "rnd", id, "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1")
	}
	if ra, rb := rnd("a"), rnd("b"); ra == rb {
		t.Fatalf("clones read the same /dev/urandom bytes: %s", ra)
	}
	log := e.LogTail(100000)
	if hits, misses := strings.Count(log, `cache_hit=true`), strings.Count(log, `cache_hit=false`); misses != 1 || hits != 1 {
		t.Fatalf("materializations: %d misses, %d hits; want exactly one download", misses, hits)
	}

	// cryoctl gc leaves the materialized snapshot alone while a sandbox
	// restored from it runs, and removes it once none does.
	gc := func() nodecache.PruneStats {
		t.Helper()
		out, errs, err := e.Cryoctl("gc", "-o", "json", "--keep-materialized", "0s")
		var r struct{ Materialized *nodecache.PruneStats }
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Materialized == nil {
			t.Fatalf("cryoctl gc: %v\n%s\n%s", err, out, errs)
		}
		return *r.Materialized
	}
	dirs := func() []string {
		d, _ := filepath.Glob(filepath.Join(nodecache.SnapshotsDir(e.Cfg.Snapshot.CacheDir), "[0-9a-f]*"))
		return d
	}
	if st := gc(); st.InUse != 1 || len(st.Removed) != 0 || len(dirs()) != 1 {
		t.Fatalf("gc with two sandboxes restored from the snapshot: %+v, left %v", st, dirs())
	}
	e.MustCtr("task", "exec", "--exec-id", "after-gc", "a", "cat", "/data/x")
	for _, id := range []string{"a", "b"} {
		e.MustCtr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	if st := gc(); len(st.Removed) != 1 || st.FreedBytes <= 0 || len(dirs()) != 0 {
		t.Fatalf("gc once no sandbox uses the snapshot: %+v, left %v", st, dirs())
	}
	// The next restore materializes it again.
	restore(t, e, "c", e.StoreURL("fan:v1"))
	if len(dirs()) != 1 {
		t.Fatalf("materialized after a restore: %v", dirs())
	}
}

// waitAdvance waits (a few seconds: the guest was just stopped and
// continued, and shares 2 cores with other VMs) until the workload's
// counter in container id passes than.
func waitAdvance(t *testing.T, e *harness.Env, id string, than int) {
	t.Helper()
	var st guestState
	if !harness.WaitFor(15*time.Second, func() bool {
		st = readState(t, e, id)
		return st.counter > than
	}) {
		t.Fatalf("%s stopped counting: %d, then still %d\n%s", id, than, st.counter, e.LogTail(30))
	}
}
