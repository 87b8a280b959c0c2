//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/stack"
)

// sharedClonesNode restores every snapshot as a shared clone.
func sharedClonesNode(c *configs.Config) { c.Memory.Clones = configs.ClonesShared }

// baseMapping is the RAM mapping of a shared clone's QEMU (id): the
// node's base, a memfd. It returns the mapping's Rss and Pss in KiB and
// the descriptor QEMU holds it by.
func baseMapping(t *testing.T, id string) (rss, pss int64, fd string) {
	t.Helper()
	pids := stack.ProcsMatching("qemu-system", "guest="+id+",")
	if len(pids) != 1 {
		t.Fatalf("%d QEMUs of %s, want 1", len(pids), id)
	}
	pid := strconv.Itoa(pids[0])
	f, err := os.Open(filepath.Join("/proc", pid, "smaps"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	var size int64
	for s := bufio.NewScanner(f); s.Scan(); {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 {
			in = len(fields) >= 6 && strings.HasPrefix(fields[5], "/memfd:cryo-base")
			continue
		}
		if !in || len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Size:":
			size = max(size, v)
		case "Rss:":
			rss += v
		case "Pss:":
			pss += v
		}
	}
	if size == 0 {
		t.Fatalf("QEMU %s of %s maps no /memfd:cryo-base", pid, id)
	}
	ents, _ := os.ReadDir(filepath.Join("/proc", pid, "fd"))
	for _, d := range ents {
		if l, _ := os.Readlink(filepath.Join("/proc", pid, "fd", d.Name())); strings.HasPrefix(l, "/memfd:cryo-base") {
			fd = filepath.Join("/proc", pid, "fd", d.Name())
		}
	}
	return rss, pss, fd
}

// TestSharedClones: on a node with [memory] clones = "shared", two clones
// of one snapshot map the node's one base of its RAM: the pages they read
// are held once (each QEMU's mapping accounts for about half of them),
// each sees only its own writes, and nothing, root or QEMU, can write the
// base. A clone's checkpoint uploads about what it wrote, not its RAM, and
// restores, as a shared clone again, to its own state; its second
// checkpoint uploads what changed since the first. When the clones are
// gone no base is left.
func TestSharedClones(t *testing.T) {
	e := harness.Start(t, sharedClonesNode)
	before := startWorkload(t, e, "src")
	// 32 MiB of random data in guest RAM (a tmpfs), which each clone
	// reads whole.
	out := e.MustCtr("task", "exec", "--exec-id", "fill", "src", "sh", "-c",
		"head -c 33554432 /dev/urandom > /dev/shm/blob; md5sum /dev/shm/blob")
	sum := strings.Fields(out)[0]
	full := checkpointReport(t, e, "src", e.StoreURL("shared:v1"))

	restore(t, e, "a", e.StoreURL("shared:v1"))
	restore(t, e, "b", e.StoreURL("shared:v1"))
	log := e.LogTail(100000)
	if strings.Count(log, "mode=shared") < 2 || !strings.Contains(log, "reused=true") {
		t.Fatalf("two shared clones, the second on the first's base, not in the log:\n%s", e.LogTail(40))
	}
	for _, id := range []string{"a", "b"} {
		got := readState(t, e, id)
		if got.bootID != before.bootID || got.secret != before.secret {
			t.Fatalf("clone %s state %+v, checkpointed %+v", id, got, before)
		}
		out := e.MustCtr("task", "exec", "--exec-id", "sum", id, "sh", "-c", "md5sum /dev/shm/blob; echo "+id+" > /dev/shm/mine")
		if f := strings.Fields(out); len(f) < 1 || f[0] != sum {
			t.Fatalf("clone %s reads blob %q, want md5 %s", id, out, sum)
		}
	}
	for _, id := range []string{"a", "b"} {
		if out := e.MustCtr("task", "exec", "--exec-id", "mine", id, "cat", "/dev/shm/mine"); strings.TrimSpace(out) != id {
			t.Fatalf("clone %s sees %q as its own mark", id, out)
		}
	}

	// Both read the 32 MiB: held once, each mapping's Pss about half.
	rssA, pssA, fd := baseMapping(t, "a")
	rssB, pssB, _ := baseMapping(t, "b")
	t.Logf("base mappings: a Rss %d Pss %d KiB, b Rss %d Pss %d KiB", rssA, pssA, rssB, pssB)
	if shared := rssA + rssB - pssA - pssB; shared < 24<<10 {
		t.Fatalf("the clones share %d KiB of their RAM mappings, want at least 24 MiB of the 32 MiB both read", shared)
	}
	checkSealedBase(t, fd)
	// cryoctl gc, another process, finds both shims' holder records valid
	// and leaves them.
	if st := gcBases(t, e); st.Live != 2 || st.Removed != 0 {
		t.Fatalf("cryoctl gc with two shared clones running: bases %+v, want 2 live holders", st)
	}

	// A's checkpoint holds what it wrote, not its RAM.
	e.MustCtr("task", "exec", "--exec-id", "more", "a", "sh", "-c", "head -c 4194304 /dev/urandom > /dev/shm/more; md5sum /dev/shm/more")
	first := checkpointReport(t, e, "a", e.StoreURL("shared:a1"))
	if first.UploadedBytes > full.UploadedBytes/4 {
		t.Fatalf("a shared clone's checkpoint uploaded %d bytes, the full snapshot %d: not incremental", first.UploadedBytes, full.UploadedBytes)
	}
	restore(t, e, "a2", e.StoreURL("shared:a1"))
	out = e.MustCtr("task", "exec", "--exec-id", "check", "a2", "sh", "-c", "md5sum /dev/shm/blob; cat /dev/shm/mine")
	if f := strings.Fields(out); len(f) != 3 || f[0] != sum || f[2] != "a" {
		t.Fatalf("restored clone of a reads %q, want blob md5 %s and mark a", out, sum)
	}
	waitAdvance(t, e, "a2", readState(t, e, "a2").counter)
	// The same snapshot restores lazily on a node without shared clones:
	// its device state carries no RAM, as a served sandbox's.
	private := e.Cfg
	private.Memory.Clones = configs.ClonesPrivate
	privatePath := filepath.Join(e.Dir, "private-clones.toml")
	e.WriteConfig(privatePath, private)
	e.MustCtr("run", "-d", "--runtime", harness.Runtime, "--runtime-config-path", privatePath,
		"--annotation", "cryo.dev/restore-from="+e.StoreURL("shared:a1"), harness.Image, "l1", "sh", "-c", "sleep 1000")
	out = e.MustCtr("task", "exec", "--exec-id", "check", "l1", "sh", "-c", "md5sum /dev/shm/blob; cat /dev/shm/mine")
	if f := strings.Fields(out); len(f) != 3 || f[0] != sum || f[2] != "a" {
		t.Fatalf("lazy restore of a's checkpoint reads %q, want blob md5 %s and mark a", out, sum)
	}
	if !strings.Contains(e.LogTail(100000), "mode=lazy") {
		t.Fatalf("the private node's restore was not lazy:\n%s", e.LogTail(40))
	}

	// Its next checkpoint: what changed since the first.
	e.MustCtr("task", "exec", "--exec-id", "small", "a", "sh", "-c", "echo changed > /dev/shm/small")
	second := checkpointReport(t, e, "a", e.StoreURL("shared:a2"))
	if second.UploadedBytes > first.UploadedBytes/2 {
		t.Fatalf("second checkpoint of a shared clone uploaded %d bytes, the first %d: the first's pages again", second.UploadedBytes, first.UploadedBytes)
	}

	for _, id := range []string{"src", "a", "b", "a2", "l1"} {
		e.MustCtr("task", "delete", "--force", id)
		e.MustCtr("container", "delete", id)
	}
	if !harness.WaitFor(20*time.Second, func() bool { return len(e.QEMUPids()) == 0 }) {
		t.Fatalf("QEMUs left: %v", e.QEMUPids())
	}
	if !harness.WaitFor(20*time.Second, func() bool { return len(baseHolders()) == 0 }) {
		t.Fatalf("base holders left after every clone ended: %v", baseHolders())
	}
}

// checkSealedBase writes, truncates and punches the base through a new
// read-write descriptor (as root): every one must fail.
func checkSealedBase(t *testing.T, fd string) {
	t.Helper()
	f, err := os.OpenFile(fd, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open the base read-write as QEMU does: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("write to the base: %v, want EPERM", err)
	}
	if err := f.Truncate(4096); !errors.Is(err, unix.EPERM) {
		t.Errorf("truncate the base: %v, want EPERM", err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); !errors.Is(err, unix.EPERM) {
		t.Errorf("punch a hole in the base: %v, want EPERM", err)
	}
}

// baseHolders are the processes holding a node base (a /memfd:cryo-base
// descriptor).
func baseHolders() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, p := range ents {
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, d := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc", p.Name(), "fd", d.Name())); strings.HasPrefix(l, "/memfd:cryo-base") {
				out = append(out, p.Name())
				break
			}
		}
	}
	return out
}

// alternatingWriter rewrites /dev/shm/w, 16 MiB, from /dev/shm/p0 and
// /dev/shm/p1 (two random patterns) in turn, a MiB at a time in order with
// a short sleep after each, counting rounds in /dev/shm/wn; its shell's pid
// is in /dev/shm/wpid. At any instant w is the new pattern up to some MiB
// and the old one after it.
const alternatingWriter = `echo $$ > /dev/shm/wpid
head -c 16777216 /dev/urandom > /dev/shm/p0; head -c 16777216 /dev/urandom > /dev/shm/p1
cp /dev/shm/p1 /dev/shm/w; n=0
while :; do b=0; while [ $b -lt 16 ]; do dd if=/dev/shm/p$((n%2)) of=/dev/shm/w bs=1M count=1 skip=$b seek=$b conv=notrunc 2>/dev/null; b=$((b+1)); sleep 0.05; done
n=$((n+1)); echo $n > /dev/shm/wn.new; mv /dev/shm/wn.new /dev/shm/wn; done`

// writerDDEnds waits (up to 10 s) for the dd of a stopped
// alternatingWriter to end its MiB: reading w while a dd writes it tears
// the MiB, and a reader that keeps pace with a running writer under load
// tears one MiB after another.
const writerDDEnds = `i=0; while grep -qx dd /proc/[0-9]*/comm 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done`

// blockLabels says, for each MiB of /dev/shm/w in id, which pattern it
// holds: '0', '1', or 'x' for neither.
func blockLabels(t *testing.T, e *harness.Env, id string) string {
	t.Helper()
	script := `for f in p0 p1 w; do i=0; while [ $i -lt 16 ]; do dd if=/dev/shm/$f bs=1M skip=$i count=1 2>/dev/null | md5sum | cut -c1-32; i=$((i+1)); done; done`
	f := strings.Fields(e.MustCtr("task", "exec", "--exec-id", "labels"+strconv.FormatInt(time.Now().UnixNano()%1e9, 10), id, "sh", "-c", script))
	if len(f) != 48 {
		t.Fatalf("block sums of %s: %q", id, f)
	}
	var b strings.Builder
	for i := range 16 {
		switch f[32+i] {
		case f[i]:
			b.WriteByte('0')
		case f[16+i]:
			b.WriteByte('1')
		default:
			b.WriteByte('x')
		}
	}
	return b.String()
}

// oneSwitch says labels are one pattern up to a block and the other after
// it, with at most the block at the switch torn (x): what a writer caught
// mid-round leaves, and a stale page anywhere would break.
func oneSwitch(labels string) bool {
	s := strings.Replace(labels, "x", "", 1)
	if len(s) < len(labels)-1 {
		return false
	}
	switches := 0
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1] {
			switches++
		}
	}
	return switches <= 1 && !strings.Contains(s, "x")
}

// TestSharedCloneCheckpointWhileWriting: a shared clone's checkpoint is
// live (the RAM streams while the guest runs, the VM stops for the last
// pass; under TCG the VM stops first, vmm's stopsFirst): taken while a
// guest process rewrites 16 MiB of its RAM, a MiB at a time, alternating
// two patterns, it restores to one instant, and the restored guest runs
// (a page of its kernel's that the save lost crashed it). The
// restore's post-restore hook stops the writer at once (its dd ends its
// MiB), and then every MiB before the writer's position holds the new
// pattern and every one after it the old: a page the checkpoint took
// from an earlier pass than the last would break that.
func TestSharedCloneCheckpointWhileWriting(t *testing.T) {
	e := harness.Start(t, sharedClonesNode)
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("sharedw:v1"))
	restore(t, e, "a", e.StoreURL("sharedw:v1"))
	e.MustCtr("task", "exec", "--detach", "--exec-id", "writer", "a", "sh", "-c", alternatingWriter)
	rounds := writerRounds(t, e, "a", 1)
	e.MustCtr("task", "exec", "--exec-id", "stop", "a", "sh", "-c", "kill -STOP $(cat /dev/shm/wpid); "+writerDDEnds)
	if labels := blockLabels(t, e, "a"); !oneSwitch(labels) || strings.Contains(labels, "x") {
		t.Fatalf("the stopped writer's own w by MiB is %s: the check is wrong", labels)
	}
	e.MustCtr("task", "exec", "--exec-id", "cont", "a", "sh", "-c", "kill -CONT $(cat /dev/shm/wpid)")

	checkpoint(t, e, "a", e.StoreURL("sharedw:a1"))
	t.Logf("checkpoint of the writing shared clone: pause window %v", lastPause(t, e))
	restore(t, e, "r", e.StoreURL("sharedw:a1"), "--annotation", "cryo.dev/post-restore-exec=kill -STOP $(cat /dev/shm/wpid)")
	out := e.MustCtr("task", "exec", "--exec-id", "wn", "r", "cat", "/dev/shm/wn")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n < rounds {
		t.Fatalf("restored writer at round %q, it had done %d before the checkpoint", out, rounds)
	}
	e.MustCtr("task", "exec", "--exec-id", "ends", "r", "sh", "-c", writerDDEnds)
	if labels := blockLabels(t, e, "r"); !oneSwitch(labels) || !strings.ContainsAny(labels, "01") {
		t.Fatalf("the restored clone's /dev/shm/w by MiB (0, 1: the patterns, x: neither) is %s: not one instant", labels)
	}
}

// gcBases runs cryoctl gc on the node cache and returns what it did to
// the shared RAM bases.
func gcBases(t *testing.T, e *harness.Env) nodecache.BasePruneStats {
	t.Helper()
	out, errs, err := e.Cryoctl("gc", "-o", "json")
	var r struct{ Bases *nodecache.BasePruneStats }
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Bases == nil {
		t.Fatalf("cryoctl gc: %v\n%s\n%s", err, out, errs)
	}
	return *r.Bases
}
