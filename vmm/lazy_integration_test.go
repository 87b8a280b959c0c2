//go:build integration

package vmm

// TestLazyRAM is the measurement behind the lazy-restore design (issues 13
// and 14): QEMU 7.2 restored with its RAM on a pagefs (FUSE) file, share=off
// from a read-only file per snapshot, and share=on from a layered file per
// sandbox. It asserts that each mode restores the guest intact and that the
// dirty set it finds is complete, and logs the numbers ("lazy:" lines).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/pagefs"
	"golang.org/x/sys/unix"
)

// lazyMemMiB is the guest's RAM (CRYO_LAZY_MEM_MIB overrides it, to see how
// a restore scales with RAM).
var lazyMemMiB = func() int {
	if v, err := strconv.Atoi(os.Getenv("CRYO_LAZY_MEM_MIB")); err == nil && v >= MinMemoryMiB {
		return v
	}
	return 512
}()

type lazySnap struct {
	ram, state string // base RAM file and device state (x-ignore-shared)
	token      string
	warmSum    string
	warmCheck  string // the guest command whose output is warmSum
	digests    [][32]byte
}

func TestLazyRAM(t *testing.T) {
	mountFusectl(t)
	snap := lazySnapshot(t)
	t.Run("Floor", func(t *testing.T) {
		m, a, d := restoreFrom(t, snap, "lzfloor", snap.ram, snap.state, false, false)
		if got := a.run(t, snap.warmCheck); got != snap.warmSum {
			t.Errorf("restored /warm sum %q, want %q", got, snap.warmSum)
		}
		t.Logf("lazy: floor (eager, local RAM file, confined private copy): first exec %v", d.Round(time.Millisecond))
		logPss(t, "floor", []*Machine{m}, m.ramFile())
	})
	t.Run("ReadAhead", func(t *testing.T) { lazyReadAhead(t, snap) })
	t.Run("ShareOff", func(t *testing.T) { lazyShareOff(t, snap) })
	t.Run("ShareOn", func(t *testing.T) { lazyShareOn(t, snap) })
	t.Run("Abort", func(t *testing.T) { lazyAbort(t, snap) })
	t.Run("ServerKilled", func(t *testing.T) { lazyServerKilled(t, snap) })
	t.Run("ServerHung", func(t *testing.T) { lazyServerHung(t, snap) })
	t.Run("ServerHungKill", func(t *testing.T) { lazyServerHungKill(t, snap) })
	t.Run("ServerStopped", func(t *testing.T) { lazyServerStopped(t, snap) })
}

// lazySnapshot boots a guest, fills 48 MiB of its RAM with random data and
// checkpoints it as the shim does for a booted sandbox.
func lazySnapshot(t *testing.T) lazySnap {
	cfg := testConfig(t, "lzsrc")
	cfg.MemoryMiB = lazyMemMiB
	src := startVM(t, cfg)
	waitConsole(t, src, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, src)
	s := lazySnap{token: a.run(t, "echo $TOKEN")}
	warm := 48
	if v, err := strconv.Atoi(os.Getenv("CRYO_LAZY_WARM_MIB")); err == nil {
		warm = v // to see how the first exec's reads depend on the warm data
	}
	if warm > lazyMemMiB*2/5 {
		// The guest's rootfs (tmpfs) takes at most half of its RAM.
		t.Fatalf("CRYO_LAZY_WARM_MIB=%d: at most %d for %d MiB of RAM", warm, lazyMemMiB*2/5, lazyMemMiB)
	}
	fill := fmt.Sprintf("dd if=/dev/urandom of=/warm bs=1M count=%d 2>/dev/null", warm)
	s.warmCheck = "sha256sum /warm | cut -c1-16"
	if warm > 256 {
		// Under TCG, random bytes and a checksum of a GiB outlast the agent's
		// deadline: repeat 64 random MiB and check the last 8 MiB.
		fill = fmt.Sprintf("dd if=/dev/urandom of=/w0 bs=1M count=64 2>/dev/null; for i in $(seq %d); do cat /w0; done > /warm; rm /w0", warm/64)
		s.warmCheck = "tail -c 8388608 /warm | sha256sum | cut -c1-16"
	}
	s.warmSum = a.run(t, fill+"; "+s.warmCheck)
	a.c.Close()
	dir := t.TempDir()
	s.state = filepath.Join(dir, "devstate")
	saveTo(t, src, s.state)
	s.ram = cfg.MemoryPath + ".base"
	if err := os.Link(cfg.MemoryPath, s.ram); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(s.ram) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(s.ram)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if s.digests, err = pagefs.ChunkDigests(f, 1<<20); err != nil {
		t.Fatal(err)
	}
	return s
}

func saveTo(t *testing.T, m *Machine, path string) time.Duration {
	t.Helper()
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := m.SaveState(ctx, w); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	return time.Since(start)
}

// base opens the snapshot's RAM file as a verified source.
func (s lazySnap) base(t *testing.T) *pagefs.VerifiedFile {
	f, err := os.Open(s.ram)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	v, err := pagefs.NewVerifiedFile(f, 1<<20, s.digests)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mountPagefs(t *testing.T, files ...*pagefs.File) *pagefs.Server {
	t.Helper()
	return mountPagefsOpts(t, pagefs.Options{}, files...)
}

func mountPagefsOpts(t *testing.T, o pagefs.Options, files ...*pagefs.File) *pagefs.Server {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := pagefs.Mount(dir, files, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A QEMU still faulting on the mount would hang the unmount.
		srv.Abort()
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return srv
}

// restoreFrom starts a machine on ram, loads state and resumes it; it
// returns the machine, an agent connection, and the time from QEMU's start
// to the answer of the first command.
func restoreFrom(t *testing.T, s lazySnap, id, ram, state string, shared, served bool) (*Machine, *agentConn, time.Duration) {
	t.Helper()
	return restorePhased(t, s, id, ram, state, shared, served, func(string) {})
}

// restorePhased is restoreFrom calling phase after QEMU started ("start"),
// after LoadState ("load") and after the first command ("exec").
func restorePhased(t *testing.T, s lazySnap, id, ram, state string, shared, served bool, phase func(string)) (*Machine, *agentConn, time.Duration) {
	t.Helper()
	cfg := testConfig(t, id)
	cfg.MemoryMiB = lazyMemMiB
	cfg.Incoming, cfg.MemoryShared, cfg.MemoryServed, cfg.MemoryPath = true, shared, served, ram
	start := time.Now()
	m := startVM(t, cfg)
	phase("start")
	r, err := os.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.LoadState(ctx, r); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	phase("load")
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	a := dialAgent(t, m)
	if got := a.run(t, "echo $TOKEN"); got != s.token {
		t.Fatalf("%s: token %q, want %q", id, got, s.token)
	}
	d := time.Since(start)
	phase("exec")
	return m, a, d
}

func lazyShareOff(t *testing.T, s lazySnap) {
	ram := pagefs.NewReadOnly("ram", s.base(t))
	srv := mountPagefs(t, ram)
	var ms []*Machine
	var first *agentConn
	for i := range 3 {
		before := ram.Stats()
		m, a, d := restoreFrom(t, s, fmt.Sprintf("lzoff%d", i), srv.Path("ram"), s.state, false, true)
		st := ram.Stats()
		t.Logf("lazy: share=off clone %d: first exec %v, FUSE read %s in %d reads before it (max read %d KiB)",
			i, d.Round(time.Millisecond), mib(st.ReadBytes-before.ReadBytes), st.Reads-before.Reads, st.MaxRead>>10)
		ms = append(ms, m)
		if i == 0 {
			first = a
			assertConfined(t, m)
		}
	}
	if got := first.run(t, s.warmCheck); got != s.warmSum {
		t.Errorf("restored /warm sum %q, want %q", got, s.warmSum)
	}
	if st := ram.Stats(); st.Writes != 0 || st.ReadErrors != 0 {
		t.Errorf("read-only file: %d writes, %d read errors", st.Writes, st.ReadErrors)
	}
	logPss(t, "share=off", ms, srv.Path("ram"))

	// The dirty set of a private mapping, from outside, during a pause.
	start := time.Now()
	first.run(t, "dd if=/dev/urandom of=/dirty bs=1M count=32 2>/dev/null; echo ok")
	t.Logf("lazy: share=off guest wrote 32 MiB in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	first.run(t, "for i in 1 2 3 4; do dd if=/dev/zero of=/rw bs=1M count=32 conv=notrunc 2>/dev/null; done; echo ok")
	t.Logf("lazy: share=off guest rewrote 32 MiB 4 times in %v", time.Since(start).Round(time.Millisecond))
	sum := first.run(t, "sha256sum /dirty | cut -c1-16")
	m := ms[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	mp, err := pagefs.FindMapping(m.Pid(), srv.Path("ram"), int64(lazyMemMiB)<<20)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	viaPagemap, err := pagefs.PrivatePagesPagemap(m.Pid(), mp)
	dPagemap := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	viaScan, err := pagefs.PrivatePagesScan(m.Pid(), mp)
	dScan := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !slicesEqual(viaPagemap, viaScan) {
		t.Errorf("pagemap found %d private pages, PAGEMAP_SCAN %d", len(viaPagemap), len(viaScan))
	}
	buf := make([]byte, len(viaScan)*pagefs.PageSize)
	start = time.Now()
	if err := pagefs.ReadPages(m.Pid(), mp, viaScan, buf); err != nil {
		t.Fatal(err)
	}
	dRead := time.Since(start)
	t.Logf("lazy: share=off dirty set: %d pages (%s) of %d MiB; pagemap read %v, PAGEMAP_SCAN %v, process_vm_readv %v",
		len(viaScan), mib(int64(len(buf))), lazyMemMiB, dPagemap, dScan, dRead)
	if int64(len(viaScan))*pagefs.PageSize < 64<<20 {
		t.Errorf("dirty set %s is smaller than the 32 MiB the guest wrote", mib(int64(len(buf))))
	}
	// RAM = base + the private pages, compared with all of RAM read through
	// /proc/<pid>/mem: a page written but missed would differ.
	merged := mergedRAM(t, s.ram, viaScan, buf)
	if err := sameAsMemory(m.Pid(), mp, merged); err != nil {
		t.Error(err)
	}
	// Status quo: the share=off device state carries the RAM.
	st := filepath.Join(t.TempDir(), "state-off")
	d := saveTo(t, m, st)
	fi, _ := os.Stat(st)
	t.Logf("lazy: share=off SaveState (RAM in the stream) %v, %s; guest /dirty sum %s", d.Round(time.Millisecond), mib(fi.Size()), sum)
}

func lazyShareOn(t *testing.T, s lazySnap) {
	base := s.base(t)
	var ms []*Machine
	var files []*pagefs.File
	var srvs []*pagefs.Server
	var agents []*agentConn
	for i := range 2 {
		layer := sparseFile(t, int64(lazyMemMiB)<<20)
		f, err := pagefs.NewLayered("ram", base, layer)
		if err != nil {
			t.Fatal(err)
		}
		srv := mountPagefs(t, f)
		tuneBDI(t, srv)
		m, a, d := restoreFrom(t, s, fmt.Sprintf("lzon%d", i), srv.Path("ram"), s.state, true, true)
		st := f.Stats()
		t.Logf("lazy: share=on clone %d: first exec %v, FUSE read %s in %d reads (max read %d KiB), wrote back %s",
			i, d.Round(time.Millisecond), mib(st.ReadBytes), st.Reads, st.MaxRead>>10, mib(st.WriteBytes))
		ms, files, srvs, agents = append(ms, m), append(files, f), append(srvs, srv), append(agents, a)
	}
	assertConfined(t, ms[0])
	for i := range ms {
		logPss(t, fmt.Sprintf("share=on clone %d", i), ms[i:i+1], srvs[i].Path("ram"))
	}
	a, m, f, srv := agents[0], ms[0], files[0], srvs[0]
	start := time.Now()
	a.run(t, "dd if=/dev/urandom of=/dirty bs=1M count=32 2>/dev/null; echo ok")
	t.Logf("lazy: share=on guest wrote 32 MiB in %v (writeback meanwhile %s)", time.Since(start).Round(time.Millisecond), mib(f.Stats().WriteBytes))
	start = time.Now()
	a.run(t, "for i in 1 2 3 4; do dd if=/dev/zero of=/rw bs=1M count=32 conv=notrunc 2>/dev/null; done; echo ok")
	t.Logf("lazy: share=on guest rewrote 32 MiB 4 times in %v", time.Since(start).Round(time.Millisecond))
	t.Logf("lazy: share=on writeback so far %s in %d writes", mib(f.Stats().WriteBytes), f.Stats().Writes)
	sum := a.run(t, "sha256sum /dirty | cut -c1-16")

	// Checkpoint: write back while the guest runs (a pre-copy pass), pause,
	// write back what it dirtied since, save the device state without RAM.
	a.run(t, "dd if=/dev/urandom of=/late bs=1M count=16 2>/dev/null; echo ok")
	pre := f.Stats()
	start = time.Now()
	if err := syncFile(srv.Path("ram")); err != nil {
		t.Fatal(err)
	}
	t.Logf("lazy: share=on pre-pause fsync (guest running) wrote back %s in %v", mib(f.Stats().WriteBytes-pre.WriteBytes), time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pauseStart := time.Now()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	before := f.Stats()
	start = time.Now()
	if err := syncFile(srv.Path("ram")); err != nil {
		t.Fatal(err)
	}
	dSync := time.Since(start)
	after := f.Stats()
	state := filepath.Join(t.TempDir(), "state-on")
	dSave := saveTo(t, m, state)
	pause := time.Since(pauseStart)
	fi, _ := os.Stat(state)
	dirty := f.DirtyPages()
	t.Logf("lazy: share=on checkpoint: fsync wrote back %s in %d writes, %v (%v/MiB); device state %s in %v; pause %v; dirty set %s",
		mib(after.WriteBytes-before.WriteBytes), after.Writes-before.Writes, dSync.Round(time.Millisecond),
		perMiB(dSync, after.WriteBytes-before.WriteBytes), mib(fi.Size()), dSave.Round(time.Millisecond), pause.Round(time.Millisecond),
		mib(int64(len(dirty))*pagefs.PageSize))
	if fi.Size() > 8<<20 {
		t.Errorf("share=on device state is %s: RAM went into the stream", mib(fi.Size()))
	}
	if int64(len(dirty))*pagefs.PageSize < 64<<20 {
		t.Errorf("dirty set %d pages is smaller than the 32 MiB the guest wrote", len(dirty))
	}
	mp, err := pagefs.FindMapping(m.Pid(), srv.Path("ram"), int64(lazyMemMiB)<<20)
	if err != nil {
		t.Fatal(err)
	}
	// Seal: the checkpoint's RAM is frozen while the guest runs on.
	gen, err := f.Seal(sparseFile(t, f.Size()))
	if err != nil {
		t.Fatal(err)
	}
	// RAM = base + layer must be what QEMU sees.
	merged := filepath.Join("/dev/shm", fmt.Sprintf("cryo-vmmtest-lzmerged-%d.ram", os.Getpid()))
	t.Cleanup(func() { os.Remove(merged) })
	if err := copyView(merged, gen); err != nil {
		t.Fatal(err)
	}
	if err := sameAsMemory(m.Pid(), mp, merged); err != nil {
		t.Error(err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	a.run(t, "dd if=/dev/urandom of=/dirty bs=1M count=8 conv=notrunc 2>/dev/null; echo ok")
	if err := syncFile(srv.Path("ram")); err != nil {
		t.Fatal(err)
	}
	t.Logf("lazy: share=on after the checkpoint the guest rewrote 8 MiB of /dirty (%v); new dirty set %s",
		time.Since(start).Round(time.Millisecond), mib(int64(len(f.DirtyPages()))*pagefs.PageSize))
	if got := a.run(t, "sha256sum /dirty | cut -c1-16"); got == sum {
		t.Fatal("the guest's rewrite of /dirty changed nothing")
	}
	if len(gen.Pages()) != len(dirty) {
		t.Errorf("sealed generation has %d pages, the dirty set had %d", len(gen.Pages()), len(dirty))
	}
	again := merged + ".again"
	t.Cleanup(func() { os.Remove(again) })
	if err := copyView(again, gen); err != nil {
		t.Fatal(err)
	}
	if fileSHA256(again) != fileSHA256(merged) {
		t.Error("the sealed generation changed while the guest ran on")
	}
	os.Remove(again)
	gen.Close()
	// ... and restores the guest with what it wrote after its restore.
	_, b, d := restoreFrom(t, s, "lzonre", merged, state, false, false)
	if got := b.run(t, "sha256sum /dirty | cut -c1-16"); got != sum {
		t.Errorf("second-generation restore: /dirty sum %q, want %q", got, sum)
	}
	if got := b.run(t, s.warmCheck); got != s.warmSum {
		t.Errorf("second-generation restore: /warm sum %q, want %q", got, s.warmSum)
	}
	t.Logf("lazy: share=on generation 2 restored (eager, from base+layer) in %v", d.Round(time.Millisecond))
}

// lazyAbort: what a dead page server does to a running QEMU.
func lazyAbort(t *testing.T, s lazySnap) {
	for _, shared := range []bool{false, true} {
		var f *pagefs.File
		if shared {
			var err error
			if f, err = pagefs.NewLayered("ram", s.base(t), sparseFile(t, int64(lazyMemMiB)<<20)); err != nil {
				t.Fatal(err)
			}
		} else {
			f = pagefs.NewReadOnly("ram", s.base(t))
		}
		srv := mountPagefs(t, f)
		m, a, _ := restoreFrom(t, s, fmt.Sprintf("lzab%v", shared), srv.Path("ram"), s.state, shared, true)
		if err := srv.Abort(); err != nil {
			t.Fatalf("abort connection %d: %v", srv.Connection(), err)
		}
		start := time.Now()
		// Fresh guest pages: QEMU faults on file pages not yet read.
		fmt.Fprintln(a.c, "dd if=/dev/zero of=/big bs=1M count=256 2>/dev/null; echo survived")
		select {
		case <-m.Exited():
			t.Logf("lazy: share=%v: after abort, qemu exited in %v: %v; stderr: %s", shared, time.Since(start).Round(time.Millisecond),
				m.Wait(context.Background()), lastLine(m.Stderr()))
		case <-time.After(20 * time.Second):
			t.Errorf("share=%v: qemu still alive 20 s after its page server's connection was aborted", shared)
		}
	}
}

// mountFusectl mounts the fuse control filesystem (Server.Abort needs it)
// if it is not mounted, until the test ends.
func mountFusectl(t *testing.T) {
	const dir = "/sys/fs/fuse/connections"
	if isMounted(dir) {
		return
	}
	if err := unix.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
		t.Fatalf("mount fusectl on %s: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// lazyReadAhead measures the first exec of one restore for several FUSE
// read sizes (max_read = readahead).
func lazyReadAhead(t *testing.T, s lazySnap) {
	for _, o := range []pagefs.Options{
		{MaxRead: 4 << 10},
		{MaxRead: 64 << 10},
		{MaxRead: 128 << 10},
		{MaxRead: 1 << 20},
	} {
		base := s.base(t)
		tr := &tracingSource{Source: base}
		ram := pagefs.NewReadOnly("ram", tr)
		srv := mountPagefsOpts(t, o, ram)
		tuneBDI(t, srv)
		var phases []string
		m, _, d := restorePhased(t, s, fmt.Sprintf("lzra%d", o.MaxRead>>10), srv.Path("ram"), s.state, false, true, func(p string) {
			phases = append(phases, fmt.Sprintf("%s %s/%d chunks", p, mib(ram.Stats().ReadBytes), base.Verified()))
		})
		st := ram.Stats()
		t.Logf("lazy: max_read %d KiB, readahead %d KiB: first exec %v, FUSE read %s in %d reads (max %d KiB); by phase: %s; distinct blocks read: %s",
			o.MaxRead>>10, o.MaxReadAhead>>10, d.Round(time.Millisecond), mib(st.ReadBytes), st.Reads, st.MaxRead>>10,
			strings.Join(phases, ", "), tr.blocks(4<<10, 64<<10, 256<<10, 1<<20, 4<<20))
		if o.MaxRead == 1<<20 {
			t.Logf("lazy: 1 MiB chunks touched before the first exec, in order: %s", ranges(base.Order()))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		m.Shutdown(ctx)
		cancel()
	}
}

// tracingSource records the ranges read from a Source.
type tracingSource struct {
	pagefs.Source
	mu   sync.Mutex
	offs [][2]int64
}

func (s *tracingSource) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	s.offs = append(s.offs, [2]int64{off, int64(len(p))})
	s.mu.Unlock()
	return s.Source.ReadAt(p, off)
}

// blocks says how much a store would send for the ranges read if it
// fetched whole chunks of each size.
func (s *tracingSource) blocks(sizes ...int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sz := range sizes {
		seen := map[int64]bool{}
		for _, r := range s.offs {
			for b := r[0] / sz; b*sz < r[0]+r[1]; b++ {
				seen[b] = true
			}
		}
		out = append(out, fmt.Sprintf("%d KiB chunks: %s", sz>>10, mib(int64(len(seen))*sz)))
	}
	return strings.Join(out, ", ")
}

// tuneBDI logs the writeback limits of the mount's backing device and sets
// those named in CRYO_LAZY_BDI ("strict_limit=0,max_bytes=N").
func tuneBDI(t *testing.T, srv *pagefs.Server) {
	dir := fmt.Sprintf("/sys/class/bdi/0:%d", srv.Connection())
	if set := os.Getenv("CRYO_LAZY_BDI"); set != "" {
		for _, kv := range strings.Split(set, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0); err != nil {
				t.Fatalf("bdi %s=%s: %v", k, v, err)
			}
		}
	}
	var got []string
	for _, k := range []string{"read_ahead_kb", "max_ratio", "max_bytes", "strict_limit", "min_ratio"} {
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil {
			got = append(got, k+"=?")
			continue
		}
		got = append(got, k+"="+strings.TrimSpace(string(b)))
	}
	t.Logf("lazy: bdi %s: %s", dir, strings.Join(got, " "))
}

// ranges writes chunk indexes as runs ("0-3 17 40-41").
func ranges(cs []int64) string {
	var b strings.Builder
	for i := 0; i < len(cs); {
		j := i + 1
		for j < len(cs) && cs[j] == cs[j-1]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if j-i == 1 {
			fmt.Fprintf(&b, "%d", cs[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", cs[i], cs[j-1])
		}
		i = j
	}
	return b.String()
}

func isMounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	return strings.Contains(string(b), " "+dir+" ")
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func sparseFile(t *testing.T, size int64) *os.File {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "cryo-vmmtest-layer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

// syncFile makes the kernel write the file's dirty page cache back to its
// filesystem (for pagefs: to the server), as the shim would at checkpoint.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// mergedRAM writes base with pages replaced by buf to a temporary file.
func mergedRAM(t *testing.T, base string, pages []int64, buf []byte) string {
	t.Helper()
	out := filepath.Join("/dev/shm", fmt.Sprintf("cryo-vmmtest-lzoffmerged-%d.ram", os.Getpid()))
	t.Cleanup(func() { os.Remove(out) })
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pages {
		copy(b[p*pagefs.PageSize:], buf[i*pagefs.PageSize:(i+1)*pagefs.PageSize])
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

func copyView(dst string, f interface {
	io.ReaderAt
	Size() int64
}) error {
	w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer w.Close()
	_, err = io.Copy(w, io.NewSectionReader(f, 0, f.Size()))
	return err
}

// sameAsMemory compares the file with pid's memory at m, read through
// /proc/<pid>/mem.
func sameAsMemory(pid int, m pagefs.Mapping, path string) error {
	want, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return err
	}
	defer mem.Close()
	got := make([]byte, m.End-m.Start)
	if _, err := mem.ReadAt(got, int64(m.Start)); err != nil {
		return fmt.Errorf("read qemu memory: %w", err)
	}
	if len(want) != len(got) {
		return fmt.Errorf("ram file %d bytes, mapping %d", len(want), len(got))
	}
	diff := 0
	for off := 0; off < len(got); off += pagefs.PageSize {
		if !bytes.Equal(got[off:off+pagefs.PageSize], want[off:off+pagefs.PageSize]) {
			diff++
		}
	}
	if diff > 0 {
		return fmt.Errorf("%d pages of qemu's RAM differ from base + dirty set", diff)
	}
	return nil
}

// logPss logs the Pss of each machine's QEMU and of its RAM mapping.
func logPss(t *testing.T, what string, ms []*Machine, ram string) {
	for i, m := range ms {
		total := smapsField("/proc/"+strconv.Itoa(m.Pid())+"/smaps_rollup", "", "Pss:")
		rss := smapsField("/proc/"+strconv.Itoa(m.Pid())+"/smaps", ram, "Rss:")
		pss := smapsField("/proc/"+strconv.Itoa(m.Pid())+"/smaps", ram, "Pss:")
		anon := smapsField("/proc/"+strconv.Itoa(m.Pid())+"/smaps", ram, "Anonymous:")
		t.Logf("lazy: %s qemu %d: Pss %d MiB; RAM mapping Rss %d MiB, Pss %d MiB, private (COW) %d MiB", what, i, total>>10, rss>>10, pss>>10, anon>>10)
	}
}

// smapsField returns field (kB) of the mapping of path in an smaps file, or
// of the file's first entry when path is "".
func smapsField(file, path, field string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return -1
	}
	in := path == ""
	for _, l := range strings.Split(string(b), "\n") {
		if fs := strings.Fields(l); len(fs) >= 6 && strings.Contains(fs[0], "-") {
			in = path == "" || strings.Join(fs[5:], " ") == path
			continue
		}
		if in && strings.HasPrefix(l, field) {
			n, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return n
		}
	}
	return -1
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func perMiB(d time.Duration, n int64) time.Duration {
	if n == 0 {
		return 0
	}
	return time.Duration(float64(d) / (float64(n) / (1 << 20)))
}

// pagefsHelperEnv makes the test binary a page server in its own process
// (mount dir, RAM file), so a test can kill it.
const pagefsHelperEnv = "CRYO_VMM_TEST_PAGEFS"

func runPagefsHelper() {
	dir, ram, _ := strings.Cut(os.Getenv(pagefsHelperEnv), "\n")
	fail := func(err error) { fmt.Fprintln(os.Stderr, "pagefs helper:", err); os.Exit(2) }
	f, err := os.Open(ram)
	if err != nil {
		fail(err)
	}
	digests, err := pagefs.ChunkDigests(f, 1<<20)
	if err != nil {
		fail(err)
	}
	v, err := pagefs.NewVerifiedFile(f, 1<<20, digests)
	if err != nil {
		fail(err)
	}
	if _, err := pagefs.Mount(dir, []*pagefs.File{pagefs.NewReadOnly("ram", v)}, pagefs.Options{}); err != nil {
		fail(err)
	}
	fmt.Println("ready")
	select {}
}

// startPagefsHelper runs a page server for s's RAM in its own process and
// returns it and its mount directory; the cleanup kills it and unmounts.
func startPagefsHelper(t *testing.T, s lazySnap) (*exec.Cmd, string, <-chan struct{}) {
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), pagefsHelperEnv+"="+dir+"\n"+s.ram)
	cmd.Stderr = os.Stderr
	out, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Process.Signal(unix.SIGCONT)
		<-exited
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	out.SetReadDeadline(time.Now().Add(20 * time.Second))
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("pagefs helper: %q, %v", line, err)
	}
	return cmd, dir, exited
}

// lazyServerKilled: the page server process is SIGKILLed under a running
// share=off restore.
func lazyServerKilled(t *testing.T, s lazySnap) {
	cmd, dir, exited := startPagefsHelper(t, s)
	m, a, d := restoreFrom(t, s, "lzkill", filepath.Join(dir, "ram"), s.state, false, true)
	t.Logf("lazy: served by a separate process: first exec %v", d.Round(time.Millisecond))
	cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("killed page server did not exit in 10 s")
	}
	var st unix.Stat_t
	t.Logf("lazy: after the server died, stat of the mount: %v", unix.Stat(dir, &st))
	time.Sleep(2 * time.Second)
	select {
	case <-m.Exited():
		t.Logf("lazy: idle qemu died within 2 s of its server")
	default:
		t.Logf("lazy: idle qemu still alive 2 s after its server died (it only faults on pages not yet cached)")
	}
	start := time.Now()
	fmt.Fprintln(a.c, "dd if=/dev/zero of=/big bs=1M count=256 2>/dev/null; echo survived")
	select {
	case <-m.Exited():
		t.Logf("lazy: after the server was killed, qemu exited %v after the guest touched new pages: %v", time.Since(start).Round(time.Millisecond), m.Wait(context.Background()))
	case <-time.After(20 * time.Second):
		t.Errorf("qemu still alive 20 s after its page server was killed and the guest touched new pages")
	}
}

// hangingSource stops answering once hang is set, until release closes.
type hangingSource struct {
	pagefs.Source
	hang    atomic.Bool
	release chan struct{}
}

func (s *hangingSource) ReadAt(p []byte, off int64) (int, error) {
	if s.hang.Load() {
		<-s.release
		return 0, io.ErrUnexpectedEOF
	}
	return s.Source.ReadAt(p, off)
}

// lazyServerHung: the page server stops answering. With the kernel's FUSE
// request timeout (fs.fuse.default_request_timeout, Linux 6.14) the
// connection is aborted and QEMU dies of SIGBUS.
func lazyServerHung(t *testing.T, s lazySnap) {
	const sysctl = "/proc/sys/fs/fuse/default_request_timeout"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatalf("%s: %v (FUSE request timeouts need Linux 6.14)", sysctl, err)
	}
	if err := os.WriteFile(sysctl, []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(sysctl, old, 0) // it applies to connections made meanwhile
	src := &hangingSource{Source: s.base(t), release: make(chan struct{})}
	srv := mountPagefs(t, pagefs.NewReadOnly("ram", src))
	t.Cleanup(func() { close(src.release) }) // before the unmount, which waits for the server's requests
	os.WriteFile(sysctl, old, 0)
	m, a, _ := restoreFrom(t, s, "lzhang", srv.Path("ram"), s.state, false, true)
	src.hang.Store(true)
	start := time.Now()
	fmt.Fprintln(a.c, "dd if=/dev/zero of=/big bs=1M count=256 2>/dev/null; echo survived")
	select {
	case <-m.Exited():
		t.Logf("lazy: server hung, request timeout 5 s: qemu exited %v after the guest touched new pages: %v", time.Since(start).Round(time.Millisecond), m.Wait(context.Background()))
	case <-time.After(60 * time.Second):
		t.Errorf("qemu still alive 60 s after its page server hung, with a 5 s FUSE request timeout")
	}
}

// lazyServerHungKill: the page server stops answering and nothing aborts
// the connection; the shim's watchdog SIGKILLs QEMU.
func lazyServerHungKill(t *testing.T, s lazySnap) {
	src := &hangingSource{Source: s.base(t), release: make(chan struct{})}
	srv := mountPagefs(t, pagefs.NewReadOnly("ram", src))
	t.Cleanup(func() { close(src.release) })
	m, a, _ := restoreFrom(t, s, "lzhangk", srv.Path("ram"), s.state, false, true)
	src.hang.Store(true)
	fmt.Fprintln(a.c, "dd if=/dev/zero of=/big bs=1M count=256 2>/dev/null; echo survived")
	time.Sleep(2 * time.Second)
	select {
	case <-m.Exited():
		t.Fatalf("qemu exited by itself under a hung server: %v", m.Wait(context.Background()))
	default:
	}
	start := time.Now()
	if err := unix.Kill(m.Pid(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Exited():
		t.Logf("lazy: server hung, no timeout: SIGKILLed qemu exited in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(m.Pid()) + "/stack")
		t.Errorf("SIGKILLed qemu still there after 10 s under a hung server; its stack:\n%s", st)
		start = time.Now()
		srv.Abort()
		select {
		case <-m.Exited():
			t.Logf("lazy: ... it exited %v after the connection was aborted", time.Since(start).Round(time.Millisecond))
		case <-time.After(10 * time.Second):
			t.Errorf("qemu still there 10 s after the abort")
		}
	}
}

// lazyServerStopped: the page server process is SIGSTOPped (hung for
// every request, FLUSH included); the shim's watchdog SIGKILLs QEMU.
func lazyServerStopped(t *testing.T, s lazySnap) {
	cmd, dir, _ := startPagefsHelper(t, s)
	m, a, _ := restoreFrom(t, s, "lzstop", filepath.Join(dir, "ram"), s.state, false, true)
	cmd.Process.Signal(unix.SIGSTOP)
	fmt.Fprintln(a.c, "dd if=/dev/zero of=/big bs=1M count=256 2>/dev/null; echo survived")
	time.Sleep(2 * time.Second)
	start := time.Now()
	if err := unix.Kill(m.Pid(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Exited():
		t.Logf("lazy: server stopped: SIGKILLed qemu exited in %v", time.Since(start).Round(time.Millisecond))
		return
	case <-time.After(10 * time.Second):
	}
	st, _ := os.ReadFile("/proc/" + strconv.Itoa(m.Pid()) + "/stack")
	t.Logf("lazy: server stopped: SIGKILLed qemu still there after 10 s; its stack: %s", strings.ReplaceAll(string(st), "\n", " | "))
	var sb unix.Stat_t
	unix.Stat(dir, &sb)
	start = time.Now()
	abort := filepath.Join("/sys/fs/fuse/connections", strconv.Itoa(int(unix.Minor(sb.Dev))), "abort")
	if err := os.WriteFile(abort, []byte("1"), 0); err != nil {
		t.Fatalf("abort: %v", err)
	}
	select {
	case <-m.Exited():
		t.Errorf("SIGKILL did not end qemu under a stopped server; aborting the connection did, in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Errorf("qemu still there 10 s after the connection was aborted")
	}
}
