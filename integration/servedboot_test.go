//go:build integration

package integration

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/pagefs"
)

// bootedNode holds booted sandboxes' RAM as [memory] booted says.
func bootedNode(booted string) harness.Option {
	return func(c *configs.Config) { c.Memory.Booted = booted }
}

// guestWriter rewrites 16 MiB of guest RAM (a /dev/shm file, from the
// random pattern) as fast as the guest can, and counts its rounds in
// /dev/shm/wn.
const guestWriter = `n=0; while :; do dd if=/dev/shm/pattern of=/dev/shm/w bs=1M count=16 conv=notrunc 2>/dev/null; n=$((n+1)); echo $n > /dev/shm/wn.new; mv /dev/shm/wn.new /dev/shm/wn; done`

// startWriter fills /dev/shm/pattern with 16 MiB of random data (its md5
// returned) and starts guestWriter in the background; it returns once
// the writer counts.
func startWriter(t *testing.T, e *harness.Env, id string) string {
	t.Helper()
	out := e.MustCtr("task", "exec", "--exec-id", "pattern", id, "sh", "-c", "head -c 16777216 /dev/urandom > /dev/shm/pattern; md5sum /dev/shm/pattern")
	e.MustCtr("task", "exec", "--detach", "--exec-id", "writer", id, "sh", "-c", guestWriter)
	writerRounds(t, e, id, 0)
	return strings.Fields(out)[0]
}

// writerRounds waits for the writer in id to count past than, and returns
// its count.
func writerRounds(t *testing.T, e *harness.Env, id string, than int) int {
	t.Helper()
	n := -1
	// Under the other lanes' load a guest's first rounds took 30 s in a
	// run: the bound is for a writer that stopped, not a slow one.
	if !harness.WaitFor(2*time.Minute, func() bool {
		out, _, err := e.Ctr("task", "exec", "--exec-id", "wn"+strconv.FormatInt(time.Now().UnixNano()%1e9, 10), id, "cat", "/dev/shm/wn")
		n, _ = strconv.Atoi(strings.TrimSpace(out))
		return err == nil && n > than
	}) {
		t.Fatalf("the guest writer in %s does not write: %d rounds, want more than %d\n%s", id, n, than, e.LogTail(30))
	}
	return n
}

// servedMounts are the pagefs mounts of e's sandboxes.
func servedMounts(e *harness.Env) int {
	b, _ := os.ReadFile("/proc/self/mounts")
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "cryo-pagefs") && strings.Contains(l, e.StateRoot) {
			n++
		}
	}
	return n
}

var capturedRe = regexp.MustCompile(`msg="checkpoint captured".* pause_window=(\S+)`)

// lastPause is the pause window of the last checkpoint the shims logged
// (the report rounds it to milliseconds).
func lastPause(t *testing.T, e *harness.Env) time.Duration {
	t.Helper()
	m := capturedRe.FindAllStringSubmatch(e.LogTail(100000), -1)
	if len(m) == 0 {
		t.Fatalf("no checkpoint captured in the log:\n%s", e.LogTail(30))
	}
	d, err := time.ParseDuration(m[len(m)-1][1])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestServedBoot: on a node with [memory] booted = "served" a booted
// sandbox's RAM is a pagefs mount; checkpointed while a guest process
// rewrites its RAM as fast as it can, it restores (lazily, the default)
// into the state at the pause: the random pattern, a mark written just
// before the checkpoint, the counter, the writer still writing. A second
// checkpoint of the same sandbox uploads a fraction of the first (the
// sealed dirty set against the first); a third with exit stops the task
// and restores eagerly.
func TestServedBoot(t *testing.T) {
	e := harness.Start(t, bootedNode(configs.BootedServed), lazyNode)
	before := startWorkload(t, e, "src")
	if n := servedMounts(e); n != 1 {
		t.Fatalf("%d pagefs mounts after a served boot, want the booted sandbox's RAM", n)
	}
	sum := startWriter(t, e, "src")
	mark := strconv.FormatInt(time.Now().UnixNano(), 10)
	e.MustCtr("task", "exec", "--exec-id", "mark", "src", "sh", "-c", "echo "+mark+" > /dev/shm/mark")
	rounds := writerRounds(t, e, "src", 0)

	first := checkpointReport(t, e, "src", e.StoreURL("served:v1"))
	t.Logf("first checkpoint of the served boot: pause window %v", lastPause(t, e))
	after := readState(t, e, "src")

	restore(t, e, "copy", e.StoreURL("served:v1"))
	got := readState(t, e, "copy")
	if got.bootID != before.bootID || got.secret != before.secret || got.file != "on-rootfs" {
		t.Fatalf("restored state %+v, checkpointed %+v", got, before)
	}
	// The counter at the pause is between what it was before the
	// checkpoint and after it, plus what the copy counted since.
	if got.counter < before.counter {
		t.Fatalf("restored counter %d, %d before the checkpoint", got.counter, before.counter)
	}
	out := e.MustCtr("task", "exec", "--exec-id", "check", "copy", "sh", "-c", "md5sum /dev/shm/pattern; cat /dev/shm/mark")
	if f := strings.Fields(out); len(f) != 3 || f[0] != sum || f[2] != mark {
		t.Fatalf("restored pattern and mark %q, want md5 %s and %s", out, sum, mark)
	}
	copyRounds := writerRounds(t, e, "copy", 0)
	if copyRounds < rounds {
		t.Fatalf("restored writer at round %d, it had done %d before the checkpoint", copyRounds, rounds)
	}
	writerRounds(t, e, "copy", copyRounds) // it still writes
	waitAdvance(t, e, "copy", got.counter)
	if !strings.Contains(e.LogTail(100000), `mode=lazy`) {
		t.Fatalf("restore was not lazy:\n%s", e.LogTail(40))
	}

	// The source runs on, and its next checkpoint is its dirty set only.
	waitAdvance(t, e, "src", after.counter)
	writerRounds(t, e, "src", rounds)
	second := checkpointReport(t, e, "src", e.StoreURL("served:v2"))
	t.Logf("second checkpoint: pause window %v, uploaded %d bytes, %.1f%% of the first's %d", lastPause(t, e),
		second.UploadedBytes, 100*float64(second.UploadedBytes)/float64(first.UploadedBytes), first.UploadedBytes)
	if second.UploadedBytes*4 > first.UploadedBytes {
		t.Errorf("second checkpoint uploaded %d bytes, the first %d: want it incremental (under a quarter)", second.UploadedBytes, first.UploadedBytes)
	}

	// With exit: the task stops; the snapshot restores eagerly too.
	checkpoint(t, e, "src", e.StoreURL("served:v3"), "--leave-running=false")
	waitStopped(t, e, "src")
	restore(t, e, "eager", e.StoreURL("served:v3"), "--annotation=cryo.dev/restore-mode=eager")
	st := readState(t, e, "eager")
	if st.bootID != before.bootID || st.secret != before.secret {
		t.Fatalf("eagerly restored state %+v, checkpointed %+v", st, before)
	}
	if out := e.MustCtr("task", "exec", "--exec-id", "check", "eager", "sh", "-c", "md5sum /dev/shm/pattern; cat /dev/shm/mark"); !strings.HasPrefix(out, sum) || !strings.Contains(out, mark) {
		t.Fatalf("eagerly restored pattern and mark %q, want md5 %s and %s", out, sum, mark)
	}
	writerRounds(t, e, "eager", writerRounds(t, e, "eager", 0))

	for _, id := range []string{"src", "copy", "eager"} {
		e.Ctr("task", "kill", "-s", "SIGKILL", id)
		waitStopped(t, e, id)
		e.MustCtr("task", "delete", id)
		e.MustCtr("c", "rm", id)
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// TestServedBootPause measures the pause window of a booted sandbox's
// checkpoint with its RAM owned (copied in the pause) and served (sealed),
// the same 256 MiB guest and workload (a 16 MiB pattern, a writer
// rewriting it as fast as it can), three checkpoints each: the served
// pause must be the shorter.
func TestServedBootPause(t *testing.T) {
	best := map[string]time.Duration{}
	for _, mode := range []string{configs.BootedOwned, configs.BootedServed} {
		t.Run(mode, func(t *testing.T) {
			e := harness.Start(t, bootedNode(mode))
			startWorkload(t, e, "src")
			startWriter(t, e, "src")
			var pauses []time.Duration
			for i := range 3 {
				r := checkpointReport(t, e, "src", e.StoreURL("pause:v"+strconv.Itoa(i)))
				d := lastPause(t, e)
				if ms := d.Milliseconds(); ms != r.PauseWindowMS {
					t.Errorf("logged pause %v, reported %d ms", d, r.PauseWindowMS)
				}
				pauses = append(pauses, d)
			}
			best[mode] = slices.Min(pauses)
			t.Logf("booted %s, 256 MiB guest, writer running: pause windows %v", mode, pauses)
			e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
			waitStopped(t, e, "src")
			e.MustCtr("task", "delete", "src")
			e.MustCtr("c", "rm", "src")
			noLeftovers(t, e)
			noLazyLeftovers(t, e)
		})
	}
	if o, s := best[configs.BootedOwned], best[configs.BootedServed]; o == 0 || s == 0 || s >= o {
		t.Errorf("best pause window: owned %v, served %v: want the served one shorter", o, s)
	} else {
		t.Logf("best pause window: owned %v, served %v (%.1fx)", o, s, float64(o)/float64(s))
	}
}

// TestServedShimKilledAfterCheckpoint: a shim that served its sandbox's
// RAM and has checkpointed it is SIGKILLed, a served boot and a lazy
// restore each. Nothing may hang on the RAM's FUSE connection (issue #21:
// a descriptor the shim kept on its own mount made its exit wait on a
// FLUSH that no server answers, and QEMU hung in writeback): QEMU exits,
// no process is left in D state, containerd drops the task, and no
// pagefs mount or fuse connection is left.
func TestServedShimKilledAfterCheckpoint(t *testing.T) {
	e := harness.Start(t, bootedNode(configs.BootedServed), lazyNode)
	snap := e.StoreURL("shimkilled:v2")
	snapshotted := false
	t.Run("booted", func(t *testing.T) {
		startWorkload(t, e, "src")
		if n := servedMounts(e); n != 1 {
			t.Fatalf("%d pagefs mounts after a served boot, want the booted sandbox's RAM", n)
		}
		startWriter(t, e, "src")
		rounds := writerRounds(t, e, "src", 0)
		checkpoint(t, e, "src", e.StoreURL("shimkilled:v1"))
		rounds = writerRounds(t, e, "src", rounds)
		checkpoint(t, e, "src", snap)
		snapshotted = true
		// The writer dirties the RAM again: at the kill, there is
		// writeback to do.
		writerRounds(t, e, "src", rounds)
		killServedShim(t, e, "src")
	})
	t.Run("lazy", func(t *testing.T) {
		if !snapshotted {
			t.Fatal("no snapshot of the served boot to restore: the booted case failed before it")
		}
		restore(t, e, "lz", snap, lazyMode)
		readState(t, e, "lz")
		rounds := writerRounds(t, e, "lz", 0)
		checkpoint(t, e, "lz", e.StoreURL("shimkilled:lz1"))
		writerRounds(t, e, "lz", rounds)
		killServedShim(t, e, "lz")
	})
}

// killServedShim SIGKILLs the shim of id, the Env's only sandbox, which
// serves its RAM, and checks that the sandbox goes away without anything
// hanging on the RAM's FUSE connection. A connection still there when the
// test ends is aborted, so that a failure does not leave the machine with
// hung processes.
func killServedShim(t *testing.T, e *harness.Env, id string) {
	t.Helper()
	shims, qemus, conns := e.ShimPids(), e.QEMUPids(), pagefsConns(e)
	if len(shims) != 1 || len(qemus) != 1 || len(conns) != 1 {
		t.Fatalf("shims %v, qemus %v, pagefs fuse connections %v: want one of each", shims, qemus, conns)
	}
	k := &killedShim{shim: shims[0], qemu: qemus[0], conn: conns[0], open: true}
	t.Cleanup(func() { k.cleanup(t, e, id) })
	if err := syscall.Kill(k.shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A process stuck in its exit has no command line: e.QEMUPids no
	// longer lists it, so the pids are watched themselves.
	if !harness.WaitFor(10*time.Second, func() bool { k.poll(); return exited(k.qemu) }) {
		t.Fatalf("qemu %d of %s still there 10 s after its shim %d was killed (fuse connection %d, waiting %d):\n%s\n%s",
			k.qemu, id, k.shim, k.conn, connWaiting(k.conn), stuckReport(k.qemu), stuckReport(k.shim))
	}
	if !harness.WaitFor(10*time.Second, func() bool { k.poll(); return exited(k.shim) }) {
		t.Fatalf("killed shim %d of %s has not exited after 10 s (fuse connection %d, waiting %d):\n%s",
			k.shim, id, k.conn, connWaiting(k.conn), stuckReport(k.shim))
	}
	// containerd runs the shim's delete action and drops the task.
	if !harness.WaitFor(30*time.Second, func() bool {
		out, _, err := e.Ctr("task", "ls")
		return err == nil && !taskRunning(out, id)
	}) {
		out, _, _ := e.Ctr("task", "ls")
		t.Fatalf("task %s still running 30 s after its shim was killed:\n%s\n%s", id, out, e.LogTail(30))
	}
	if out, errs, err := e.Ctr("task", "delete", id); err != nil && !strings.Contains(out+errs, "not found") {
		t.Fatalf("ctr task delete %s after its shim was killed: %v\n%s%s", id, err, out, errs)
	}
	e.MustCtr("c", "rm", id)
	if !harness.WaitFor(10*time.Second, func() bool { k.poll(); return servedMounts(e) == 0 && !k.open }) {
		t.Fatalf("after the shim of %s was killed: %d pagefs mounts left, fuse connection %d open: %v, waiting %d",
			id, servedMounts(e), k.conn, k.open, connWaiting(k.conn))
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// killedShim is a shim the test killed, its QEMU, and the fusectl
// connection of the RAM it served.
type killedShim struct {
	shim, qemu, conn int
	// open: the connection has been there at every poll since the kill.
	// Once gone, its number may be another mount's.
	open bool
}

// poll notes the connection gone: from then on cleanup leaves its number
// alone.
func (k *killedShim) poll() {
	if k.open && connWaiting(k.conn) < 0 {
		k.open = false
	}
}

// cleanup aborts the connection if it is still open, fails the test
// naming it, and removes the task and container the test could not.
func (k *killedShim) cleanup(t *testing.T, e *harness.Env, id string) {
	k.poll()
	if !k.open {
		return
	}
	w := connWaiting(k.conn)
	if err := pagefs.AbortConnection(uint32(k.conn)); err != nil {
		t.Errorf("abort fuse connection %d of %s's killed shim: %v", k.conn, id, err)
		return
	}
	t.Errorf("fuse connection %d of %s's RAM still open after its shim %d was killed (%d requests waiting): aborted it", k.conn, id, k.shim, w)
	harness.WaitFor(15*time.Second, func() bool { return exited(k.qemu) && exited(k.shim) })
	e.Ctr("task", "rm", "-f", id)
	e.Ctr("c", "rm", id)
}

// pagefsConns are the fusectl connection numbers (the minor device) of
// e's pagefs mounts.
func pagefsConns(e *harness.Env) []int {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var conns []int
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 || !strings.Contains(l, "cryo-pagefs") || !strings.HasPrefix(f[4], e.StateRoot) {
			continue
		}
		if _, minor, ok := strings.Cut(f[2], ":"); ok {
			if n, err := strconv.Atoi(minor); err == nil {
				conns = append(conns, n)
			}
		}
	}
	return conns
}

// connWaiting is the number of requests waiting on fuse connection n, -1
// if there is no such connection.
func connWaiting(n int) int {
	b, err := os.ReadFile(filepath.Join(pagefs.FusectlDir, strconv.Itoa(n), "waiting"))
	if err != nil {
		return -1
	}
	w, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return w
}

// taskRunning reports whether ctr task ls output lists id as running.
func taskRunning(ls, id string) bool {
	for _, l := range strings.Split(ls, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == id {
			return f[2] == "RUNNING"
		}
	}
	return false
}

// threadStates are the states (R, S, D, Z...) of pid's threads by thread
// id; none once pid is reaped.
func threadStates(pid int) map[string]string {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	st := map[string]string{}
	for _, d := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, d.Name()))
		if err != nil {
			continue
		}
		// The state follows the command name, which may hold spaces
		// and parentheses.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 0 {
				st[d.Name()] = f[0]
			}
		}
	}
	return st
}

// exited reports whether pid has exited: reaped, or a zombie.
func exited(pid int) bool {
	for _, s := range threadStates(pid) {
		if s != "Z" && s != "X" {
			return false
		}
	}
	return true
}

// stuckReport describes pid's threads, with the wait channel and kernel
// stack of those in D state.
func stuckReport(pid int) string {
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d (%s):", pid, strings.TrimSpace(string(comm)))
	st := threadStates(pid)
	if len(st) == 0 {
		b.WriteString(" gone")
	}
	tids := slices.Sorted(maps.Keys(st))
	for _, tid := range tids {
		fmt.Fprintf(&b, " %s:%s", tid, st[tid])
	}
	for _, tid := range tids {
		if st[tid] != "D" {
			continue
		}
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, tid))
		stack, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stack", pid, tid))
		fmt.Fprintf(&b, "\n  thread %s in D state, wchan %s, stack:\n%s", tid, wchan, stack)
	}
	return b.String()
}
