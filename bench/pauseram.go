package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/internal/busybox"
)

// memwImage is the image with the guest memory writer.
const memwImage = "cryo.local/memw:1"

// memwLog is where the writer's reports go in the guest (its root disk,
// so a restored sandbox's writer goes on appending to the same file).
const memwLog = "/tmp/memw.log"

// Kinds of sandbox whose pause the issue 21 rows compare.
const (
	kindBooted   = "booted"
	kindRestored = "restored"
	// kindShared is a shared clone ([memory] clones = "shared"), restored
	// from the same snapshot: informational, its RAM is in the device
	// state QEMU streams in the pause.
	kindShared = "shared"
)

// pauseKinds are the kinds measured at every size, in report order.
var pauseKinds = []string{kindBooted, kindRestored, kindShared}

// pauseVMMiB is the guest RAM of a sandbox with inUse MiB written by the
// writer: the VM must be larger than what is in use (its kernel, the
// agent and the page cache need room too).
func pauseVMMiB(inUse int) int { return inUse + max(256, inUse/4) }

// pauseRAM: issue 21's rows. For each size in PauseRAMMiB a booted
// sandbox runs the writer over that much RAM and is checkpointed while it
// writes (its pause window, and the writer's speed during the checkpoint
// and right after it); its first snapshot is restored lazily, the writer goes on
// over every page, and the restored sandbox is checkpointed the same way.
// Then the QEMU Pss of 1 and of PssClones lazy clones of one snapshot,
// and of 1 and WarmClones of a warm one, each clone reading its warm state.
func (r *runner) pauseRAM() error {
	if err := r.importMemw(); err != nil {
		return err
	}
	for _, inUse := range r.o.PauseRAMMiB {
		if err := r.pauseRAMSize(inUse); err != nil {
			return fmt.Errorf("%d MiB in use: %w", inUse, err)
		}
	}
	for _, kind := range pauseKinds {
		small, large := r.o.PauseRAMMiB[0], r.o.PauseRAMMiB[len(r.o.PauseRAMMiB)-1]
		r.r.add("pause_ram", pauseRatioRow(kind, small, large), "ratio",
			ratio(r.r.value(pauseRow(kind, large)), r.r.value(pauseRow(kind, small))))
	}
	if err := r.clonesPss(); err != nil {
		return err
	}
	return r.warmClonesPss()
}

func pauseRow(kind string, inUse int) string {
	return fmt.Sprintf("pause_%s_%dMiB_in_use", kind, inUse)
}

func pauseRatioRow(kind string, small, large int) string {
	return fmt.Sprintf("pause_%s_%dMiB_over_%dMiB", kind, large, small)
}

// cloneRows names the rows of a set of lazy clones of one snapshot:
// pss is their summed QEMU Pss, ramPss the part of it in the guest RAM
// mappings (what sharing pages can change, where the rest, QEMU's own
// memory, grows with the clones whatever the RAM mapping), ratio and
// ramRatio compare n clones' with one's.
type cloneRows string

const (
	idleClones cloneRows = "lazy_clones"      // of the idle template, after a first exec
	warmClones cloneRows = "lazy_warm_clones" // of the warm snapshot, each after reading its fill
	// The same as shared clones ([memory] clones = "shared"): every
	// clone maps the node's one base of the snapshot's RAM.
	sharedIdleClones cloneRows = "shared_clones"
	sharedWarmClones cloneRows = "shared_warm_clones"
)

func (c cloneRows) pss(n int) string      { return fmt.Sprintf("%s_%d_qemu_pss_total", c, n) }
func (c cloneRows) ratio(n int) string    { return fmt.Sprintf("%s_%d_over_1_qemu_pss", c, n) }
func (c cloneRows) ramPss(n int) string   { return fmt.Sprintf("%s_%d_guest_ram_pss_total", c, n) }
func (c cloneRows) ramRatio(n int) string { return fmt.Sprintf("%s_%d_over_1_guest_ram_pss", c, n) }

// shimPss and shimIdlePss are the n clones' shims' summed Pss right after
// the first execs and after shimIdleWait of idling (informational: a
// sandbox costs its shim's memory beside its QEMU's).
func (c cloneRows) shimPss(n int) string     { return fmt.Sprintf("%s_%d_shim_pss_total", c, n) }
func (c cloneRows) shimIdlePss(n int) string { return fmt.Sprintf("%s_%d_shim_pss_idle_total", c, n) }

// names are the rows for 1 and n clones, in report order.
func (c cloneRows) names(n int) []string {
	names := []string{c.pss(1), c.pss(n), c.ratio(n), c.ramPss(1), c.ramPss(n), c.ramRatio(n), c.shimPss(n)}
	if c.measuresIdleShims() {
		names = append(names, c.shimIdlePss(n))
	}
	return names
}

// measuresIdleShims: the lazy clones' shims serve their RAM (pagefs), and
// what they keep once idle is the row; the others' are measured right
// after the execs only (each wait costs shimIdleWait).
func (c cloneRows) measuresIdleShims() bool { return c == idleClones }

// shimIdleWait covers a shim's trims: its decoded chunks dropped after
// 10 s unused, its heap trimmed every 30 s (shim/memory.go).
const shimIdleWait = 45 * time.Second

// warmReadRow is the warm clones' read of their fill, fill MiB.
func warmReadRow(fill int) string { return fmt.Sprintf("lazy_warm_first_read_%dMiB", fill) }

func memwRows(kind string, inUse int) (idle, during, ratio string) {
	p := fmt.Sprintf("memwrite_%s_%dMiB_", kind, inUse)
	return p + "idle", p + "checkpoint", p + "checkpoint_over_idle"
}

// importMemw imports an image with busybox and the stack's cryoctl as
// MemWriterName into both snapshotters.
func (r *runner) importMemw() error {
	bin := r.s.Bin("cryoctl")
	if err := staticELF(bin); err != nil {
		return fmt.Errorf("%s as the guest's memory writer: %w", bin, err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	img := filepath.Join(r.s.Dir, "memw.tar")
	spec := busybox.Spec{Name: memwImage, Cmd: []string{"/bin/sh"}, AllApplets: true,
		Files: []busybox.File{{Path: "bin/" + MemWriterName, Mode: 0o755, Content: string(b)}}}
	if err := busybox.WriteSpecFile(img, spec); err != nil {
		return err
	}
	defer os.Remove(img)
	for _, sn := range []string{"overlayfs", "blockfile"} {
		if _, err := r.s.CtrOK("image", "import", "--snapshotter", sn, img); err != nil {
			return err
		}
	}
	return nil
}

// pauseRAMSize measures one size: booted, then restored from the booted
// sandbox's first snapshot, lazily and as a shared clone.
func (r *runner) pauseRAMSize(inUse int) error {
	vm := pauseVMMiB(inUse)
	id := r.id(fmt.Sprintf("pr%d-", inUse))
	script := fmt.Sprintf("exec /bin/%s %d >%s 2>&1", MemWriterName, inUse, memwLog)
	ann := map[string]string{"cryo.dev/memory": strconv.Itoa(vm)}
	if err := r.startMemw("", id, ann, script); err != nil {
		return err
	}
	// The first sweep fills the RAM (first touches); the guest is slow
	// under TCG: a minute per GiB is generous.
	fillTimeout := time.Minute + time.Duration(inUse)*time.Minute/1024
	if _, err := r.waitSweeps(id, 1, fillTimeout); err != nil {
		r.remove(id)
		return err
	}
	snap := r.s.StoreURL(fmt.Sprintf("pr%d:booted0", inUse))
	err := r.pauseRAMKind(kindBooted, inUse, id, func(i int) string {
		if i == 0 {
			return snap
		}
		return r.s.StoreURL(fmt.Sprintf("pr%d:booted%d", inUse, i))
	})
	r.remove(id)
	if err != nil {
		return err
	}

	if err := r.pauseRestored(kindRestored, "", snap, inUse, script, fillTimeout); err != nil {
		return err
	}
	shared, err := r.sharedConfig()
	if err != nil {
		return err
	}
	return r.pauseRestored(kindShared, shared, snap, inUse, script, fillTimeout)
}

// pauseRestored measures a sandbox restored from snap by the config
// cfgPath ("" the stack's).
func (r *runner) pauseRestored(kind, cfgPath, snap string, inUse int, script string, fillTimeout time.Duration) error {
	rid := r.id(fmt.Sprintf("pr%s%d-", kind[:1], inUse))
	if err := r.startMemw(cfgPath, rid, modeAnn(snap, configs.RestoreLazy), script); err != nil {
		return err
	}
	defer r.remove(rid)
	// The restored writer goes on from where it was: let it write every
	// page once more, so that the whole RAM was fetched and written in the
	// restored VM before it is measured.
	s, err := r.waitSweeps(rid, 0, time.Minute)
	if err != nil {
		return err
	}
	if _, err := r.waitSweeps(rid, s.sweeps+2, fillTimeout); err != nil {
		return err
	}
	return r.pauseRAMKind(kind, inUse, rid, func(i int) string {
		return r.s.StoreURL(fmt.Sprintf("pr%d:%s%d", inUse, kind, i))
	})
}

// pauseRAMKind checkpoints sandbox id Runs times while its writer writes:
// the pause windows, and the writer's speed from the checkpoint's start to
// its end and, idle, in a window as long right after it. The windows are
// alike (both bounded by the execs that read the writer's report, which
// take guest CPU too), so their ratio is about the checkpoint.
func (r *runner) pauseRAMKind(kind string, inUse int, id string, to func(int) string) error {
	var pause, idle, during []float64
	for i := range r.o.Runs {
		quiesce()
		s0, err := r.memwSample(id)
		if err != nil {
			return err
		}
		c, err := r.checkpointNow(id, to(i))
		if err != nil {
			return err
		}
		s1, err := r.memwSample(id)
		if err != nil {
			return err
		}
		time.Sleep(s1.at.Sub(s0.at))
		s2, err := r.memwSample(id)
		if err != nil {
			return err
		}
		pause = append(pause, float64(c.PauseWindowMS))
		during, idle = append(during, writeRate(s0, s1)), append(idle, writeRate(s1, s2))
	}
	in, dn, rn := memwRows(kind, inUse)
	r.r.add("pause_ram", pauseRow(kind, inUse), "ms", pause...)
	r.r.add("pause_ram", in, "MiB/s", idle...)
	r.r.add("pause_ram", dn, "MiB/s", during...)
	r.r.add("pause_ram", rn, "ratio", ratio(Median(during), Median(idle)))
	r.progress("pause, %s sandbox, %d MiB in use (%d MiB VM) and written while it runs: %.0f ms; writer %.0f MiB/s idle, %.0f MiB/s during the checkpoint",
		kind, inUse, pauseVMMiB(inUse), Median(pause), Median(idle), Median(during))
	return nil
}

// startMemw runs a detached container of the writer's image, with the
// config cfgPath ("" the stack's).
func (r *runner) startMemw(cfgPath, id string, ann map[string]string, script string) error {
	_, err := r.s.CtrOK(r.runImageArgs(memwImage, cfgPath, id, ann, script)...)
	return err
}

// memwSample reads the writer's last report; its time is the middle of
// the exec that read it.
func (r *runner) memwSample(id string) (memwSample, error) {
	t0 := time.Now()
	out, err := r.exec(id, "tail", "-n", "3", memwLog)
	t1 := time.Now()
	if err != nil {
		return memwSample{}, err
	}
	s, err := parseMemw(out)
	s.at = t0.Add(t1.Sub(t0) / 2)
	return s, err
}

// waitSweeps waits until the writer in id has done n sweeps over its RAM.
func (r *runner) waitSweeps(id string, n int64, timeout time.Duration) (memwSample, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := r.memwSample(id)
		if err == nil && s.sweeps >= n {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("the writer in %s did not finish %d sweeps in %s (last: %+v, %v)", id, n, timeout, s, err)
		}
		if err := r.ctx.Err(); err != nil {
			return s, err
		}
		time.Sleep(time.Second)
	}
}

// clonesPss: the summed QEMU Pss of 1 and of PssClones lazy clones of the
// idle template, each measured after every clone's first exec answered.
// The clones start one after the other: the row is about memory, and
// starting them at once only adds CPU contention on a small machine.
func (r *runner) clonesPss() error {
	s, err := r.smallLazySnapshot()
	if err != nil {
		return err
	}
	n := r.o.PssClones
	firstExec := func(id string) error {
		_, err := r.exec(id, "true")
		return err
	}
	m, err := r.clones(idleClones, "", s.url, n, firstExec)
	if err != nil {
		return err
	}
	r.progress("lazy clones of the idle template after their first exec: %s", m.summary(n))
	shared, err := r.sharedConfig()
	if err != nil {
		return err
	}
	if m, err = r.clones(sharedIdleClones, shared, s.url, n, firstExec); err != nil {
		return fmt.Errorf("shared clones: %w", err)
	}
	r.progress("shared clones of the idle template after their first exec: %s", m.summary(n))
	return nil
}

// sharedConfig is the stack's config with [memory] clones = "shared", for
// the shared clones' rows: written once per run.
func (r *runner) sharedConfig() (string, error) {
	path := filepath.Join(r.s.Dir, "cryo-shared-clones.toml")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	c := r.s.Cfg
	c.Memory.Clones = configs.ClonesShared
	return path, r.s.WriteConfig(path, c)
}

// clones measures 1 and n clones of url (restored lazily, by the config
// cfgPath: "" the stack's), each after first, and adds their rows.
func (r *runner) clones(rows cloneRows, cfgPath, url string, n int, first func(id string) error) (clonesPair, error) {
	var m clonesPair
	for i, k := range []int{1, n} {
		var err error
		var idle time.Duration
		if i == 1 && rows.measuresIdleShims() {
			idle = shimIdleWait
		}
		if m[i], err = r.clonesPssOf(cfgPath, url, k, first, idle); err != nil {
			return m, fmt.Errorf("%d lazy clones: %w", k, err)
		}
		r.r.add("pause_ram", rows.pss(k), "MiB", mib(m[i].pss))
		r.r.add("pause_ram", rows.ramPss(k), "MiB", mib(m[i].ram))
	}
	r.r.add("pause_ram", rows.shimPss(n), "MiB", mib(m[1].shim))
	if rows.measuresIdleShims() {
		r.r.add("pause_ram", rows.shimIdlePss(n), "MiB", mib(m[1].shimIdle))
	}
	r.r.add("pause_ram", rows.ratio(n), "ratio", ratio(mib(m[1].pss), mib(m[0].pss)))
	r.r.add("pause_ram", rows.ramRatio(n), "ratio", ratio(mib(m[1].ram), mib(m[0].ram)))
	return m, nil
}

// clonesPair is the memory of one clone and of n.
type clonesPair [2]clonesMem

func (m clonesPair) summary(n int) string {
	pss1, pssN, ram1, ramN := mib(m[0].pss), mib(m[1].pss), mib(m[0].ram), mib(m[1].ram)
	s := fmt.Sprintf("QEMU Pss 1: %.0f MiB, %d: %.0f MiB (%.2fx); of it guest RAM 1: %.0f MiB, %d: %.0f MiB (%.2fx); the %d shims' Pss %.0f MiB",
		pss1, n, pssN, ratio(pssN, pss1), ram1, n, ramN, ratio(ramN, ram1), n, mib(m[1].shim))
	if m[1].shimIdle > 0 {
		s += fmt.Sprintf(", %.0f MiB after %v idle", mib(m[1].shimIdle), shimIdleWait)
	}
	return s
}

// warmClonesPss: clonesPss for WarmClones lazy clones of a warm snapshot,
// a guest that filled WarmFillMiB of tmpfs, each clone's first exec
// reading the whole fill: what sharing the pages none of them wrote
// could save, where the idle template's clones read too little for it to
// matter (issue 21's design record, "Item 2, measured"). Informational:
// the target is on the idle rows. The reads are timed too (the
// first clone's from S3 on loopback, the node cache holding it for the
// others); under TCG that time is the guest's own cat | wc, as slow with
// every page resident (docs/performance.md, "Warm clones").
func (r *runner) warmClonesPss() error {
	fill, n := r.o.WarmFillMiB, r.o.WarmClones
	s, err := r.filledSnapshot(fill)
	if err != nil {
		return err
	}
	var reads []float64
	m, err := r.clones(warmClones, "", s.url, n, func(id string) error {
		d, err := r.readFill(id, fill)
		reads = append(reads, ms(d))
		return err
	})
	if err != nil {
		return fmt.Errorf("the warm snapshot: %w", err)
	}
	r.r.add("pause_ram", warmReadRow(fill), "ms", reads...)
	r.progress("lazy clones of the warm snapshot (%d MiB filled, %.0f MiB stored), each after reading the fill: %s; the read %.0f ms",
		fill, mib(s.stored), m.summary(n), Median(reads))
	shared, err := r.sharedConfig()
	if err != nil {
		return err
	}
	m, err = r.clones(sharedWarmClones, shared, s.url, n, func(id string) error {
		_, err := r.readFill(id, fill)
		return err
	})
	if err != nil {
		return fmt.Errorf("the warm snapshot, shared clones: %w", err)
	}
	r.progress("shared clones of the warm snapshot, each after reading the fill: %s", m.summary(n))
	return nil
}

// readFill reads the whole fill of a clone of a filled snapshot as its
// first exec, and checks that it was there: the time from the exec's
// start to its answer.
func (r *runner) readFill(id string, fill int) (time.Duration, error) {
	quiesce()
	t0 := time.Now()
	out, err := r.exec(id, "sh", "-c", fmt.Sprintf("cat %s.rnd %s.txt | wc -c", fillPath, fillPath))
	d := time.Since(t0)
	if err != nil {
		return d, err
	}
	return d, checkFillRead(out, fill)
}

// checkFillRead checks the byte count a clone read from its fill: at least
// half the fill (fillScript writes whole copies of the guest's busybox,
// whose size the host does not know exactly).
func checkFillRead(out string, fill int) error {
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return fmt.Errorf("reading the fill: wc -c said %q", out)
	}
	if n < int64(fill)<<20/2 {
		return fmt.Errorf("reading the fill: %d bytes, want about %d MiB", n, fill)
	}
	return nil
}

// clonesMem is the summed Pss of some clones' QEMUs and the part of it in
// their guest RAM mappings, and their shims' summed Pss right after the
// first execs and after idling (0: not measured), in bytes.
type clonesMem struct{ pss, ram, shim, shimIdle int64 }

// clonesPssOf starts n lazy clones of url one after the other, each
// answering first (its first exec) before the next starts, and sums
// their memory; with idle > 0, their shims' again after idle.
func (r *runner) clonesPssOf(cfgPath, url string, n int, first func(id string) error, idle time.Duration) (clonesMem, error) {
	ids := make([]string, 0, n)
	defer func() { r.remove(ids...) }()
	for range n {
		id := r.id("pss")
		ids = append(ids, id)
		if err := r.start(cfgPath, id, modeAnn(url, configs.RestoreLazy), "sleep 100000"); err != nil {
			return clonesMem{}, err
		}
		if err := first(id); err != nil {
			return clonesMem{}, err
		}
	}
	// A QEMU of an earlier step may still be exiting.
	pids := r.s.QEMUPids()
	for deadline := time.Now().Add(30 * time.Second); len(pids) != n && time.Now().Before(deadline); pids = r.s.QEMUPids() {
		time.Sleep(500 * time.Millisecond)
	}
	if len(pids) != n {
		return clonesMem{}, fmt.Errorf("%d QEMU processes running, want %d", len(pids), n)
	}
	m := clonesMem{pss: procsMem(pids).pss, ram: guestRAMPss(pids), shim: procsMem(r.s.ShimPids()).pss}
	if idle > 0 {
		time.Sleep(idle)
		m.shimIdle = procsMem(r.s.ShimPids()).pss
	}
	return m, nil
}

// pauseRAMTargets checks issue 21's targets on the rows of pauseRAM: the
// pause of the largest size at most 1.2x the smallest's and at most 30 ms,
// the writer within 10% of its idle speed while a checkpoint runs (the
// worst size), booted and lazily restored; and PssClones clones at most 2x
// one, lazy and shared, and the warm snapshot's shared clones too (the
// clones that read enough shared state for sharing to show).
func (r *runner) pauseRAMTargets() {
	rep := r.r
	small, large := r.o.PauseRAMMiB[0], r.o.PauseRAMMiB[len(r.o.PauseRAMMiB)-1]
	for _, kind := range []string{kindBooted, kindRestored} {
		v := rep.value(pauseRatioRow(kind, small, large))
		l := rep.value(pauseRow(kind, large))
		rep.target(fmt.Sprintf("pause, %s, %d / %d MiB in use (writer running)", kind, large, small), "<= 1.20, and <= 30 ms", v,
			v > 0 && v <= 1.2 && l <= 30, fmt.Sprintf("%.0f ms vs %.0f ms", l, rep.value(pauseRow(kind, small))))
	}
	for _, kind := range []string{kindBooted, kindRestored} {
		worst, at := 0.0, 0
		for _, inUse := range r.o.PauseRAMMiB {
			_, _, rn := memwRows(kind, inUse)
			if v := rep.value(rn); at == 0 || v < worst {
				worst, at = v, inUse
			}
		}
		in, dn, _ := memwRows(kind, at)
		rep.target(fmt.Sprintf("guest write speed during a checkpoint / idle, %s, worst size", kind), ">= 0.90", worst, worst >= 0.9,
			fmt.Sprintf("%d MiB in use: %.0f MiB/s vs %.0f MiB/s", at, rep.value(dn), rep.value(in)))
	}
	for _, c := range []struct {
		rows cloneRows
		n    int
		what string
	}{
		{idleClones, r.o.PssClones, "lazy clones"},
		{sharedIdleClones, r.o.PssClones, "shared clones"},
		{sharedWarmClones, r.o.WarmClones, "shared clones of the warm snapshot"},
	} {
		v := rep.value(c.rows.ratio(c.n))
		rep.target(fmt.Sprintf("%d %s / 1, summed QEMU Pss after the first exec", c.n, c.what), "<= 2.0", v, v > 0 && v <= 2,
			fmt.Sprintf("%.0f MiB vs %.0f MiB", rep.value(c.rows.pss(c.n)), rep.value(c.rows.pss(1))))
	}
}

// pauseRAMRowNames are the rows of pauseRAM with sizes s, in order.
func pauseRAMRowNames(s Sizes) []string {
	var n []string
	for _, inUse := range s.PauseRAMMiB {
		for _, kind := range pauseKinds {
			in, dn, rn := memwRows(kind, inUse)
			n = append(n, pauseRow(kind, inUse), in, dn, rn)
		}
	}
	small, large := s.PauseRAMMiB[0], s.PauseRAMMiB[len(s.PauseRAMMiB)-1]
	for _, kind := range pauseKinds {
		n = append(n, pauseRatioRow(kind, small, large))
	}
	n = append(n, idleClones.names(s.PssClones)...)
	n = append(n, sharedIdleClones.names(s.PssClones)...)
	n = append(append(n, warmClones.names(s.WarmClones)...), warmReadRow(s.WarmFillMiB))
	return append(n, sharedWarmClones.names(s.WarmClones)...)
}
