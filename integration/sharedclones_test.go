//go:build integration

package integration

import (
	"bufio"
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

	// Its next checkpoint: what changed since the first.
	e.MustCtr("task", "exec", "--exec-id", "small", "a", "sh", "-c", "echo changed > /dev/shm/small")
	second := checkpointReport(t, e, "a", e.StoreURL("shared:a2"))
	if second.UploadedBytes > first.UploadedBytes/2 {
		t.Fatalf("second checkpoint of a shared clone uploaded %d bytes, the first %d: the first's pages again", second.UploadedBytes, first.UploadedBytes)
	}

	for _, id := range []string{"src", "a", "b", "a2"} {
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
