package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/nodecache"
	shimapi "github.com/cryo-runtime/cryo/shim/api/v1"
	"github.com/cryo-runtime/cryo/stack"
)

// Sizes are what one run measures and how big.
type Sizes struct {
	Runs          int           `json:"runs"`          // samples per median
	GuestMiB      int           `json:"guestMiB"`      // guest of the latency and fan-out rows
	SmallGuestMiB int           `json:"smallGuestMiB"` // pause window, small guest
	LargeGuestMiB int           `json:"largeGuestMiB"` // pause window, pipeline, incremental, shim RSS
	SmallDiskMiB  int           `json:"smallDiskMiB"`  // pause window, small writable disk
	LargeDiskMiB  int           `json:"largeDiskMiB"`  // pause window, large writable disk
	Clones        []int         `json:"clones"`        // concurrent restores
	WarmUp        time.Duration `json:"warmUpNs"`      // the expensive workload's warm-up (ns in JSON)
	ChangePercent int           `json:"changePercent"` // RAM changed before the second checkpoint
	ChunkMiB      int           `json:"chunkMiB"`      // snapshot chunk size (0: the config's default)
	LazyFillMiB   int           `json:"lazyFillMiB"`   // RAM the large lazy-restore guest fills (its RAM: 2.5x)
	PauseRAMMiB   []int         `json:"pauseRamMiB"`   // issue 21: RAM the guest's writer keeps writing, ascending
	PssClones     int           `json:"pssClones"`     // issue 21: lazy clones whose QEMU Pss is compared with one's
	WarmClones    int           `json:"warmClones"`    // issue 21: lazy clones of the warm snapshot, each reading its fill
	WarmFillMiB   int           `json:"warmFillMiB"`   // issue 21: the warm snapshot's fill (its RAM: 2.5x)
}

// Quick is the smallest run: every row once, two VMs at a time at most
// (but four idle clones for the Pss row), no 4 GiB writer.
func Quick() Sizes {
	return Sizes{Runs: 1, GuestMiB: 256, SmallGuestMiB: 256, LargeGuestMiB: 384, SmallDiskMiB: 256, LargeDiskMiB: 512,
		Clones: []int{1, 2}, WarmUp: 3 * time.Second, ChangePercent: 5, LazyFillMiB: 128,
		PauseRAMMiB: []int{256, 1024}, PssClones: 4, WarmClones: 2, WarmFillMiB: 128}
}

// Default fits a small shared machine (a few VMs at a time).
func Default() Sizes {
	return Sizes{Runs: 3, GuestMiB: 256, SmallGuestMiB: 256, LargeGuestMiB: 512, SmallDiskMiB: 1024, LargeDiskMiB: 2048,
		Clones: []int{1, 2, 4}, WarmUp: 10 * time.Second, ChangePercent: 5, LazyFillMiB: 384,
		PauseRAMMiB: []int{256, 1024}, PssClones: 8, WarmClones: 4, WarmFillMiB: 384}
}

// Full is the sizes: 1 GiB guests, 8 GiB disks, 8 clones, 20 s
// warm-up, a writer over 256 MiB, 1 GiB and 4 GiB. The warm clones are
// 4 of a 512 MiB fill, not 8 of the lazy rows' 1 GiB: each clone reads
// its fill into its own RAM file today, and 8 GiB of that does not fit
// the bench's machine beside the rest.
func Full() Sizes {
	return Sizes{Runs: 3, GuestMiB: 256, SmallGuestMiB: 256, LargeGuestMiB: 1024, SmallDiskMiB: 1024, LargeDiskMiB: 8192,
		Clones: []int{1, 4, 8}, WarmUp: 20 * time.Second, ChangePercent: 5, LazyFillMiB: 1024,
		PauseRAMMiB: []int{256, 1024, 4096}, PssClones: 8, WarmClones: 4, WarmFillMiB: 512}
}

// Validate checks the sizes.
func (s Sizes) Validate() error {
	switch {
	case s.Runs < 1:
		return errors.New("runs must be at least 1")
	case s.GuestMiB < 128 || s.SmallGuestMiB < 128 || s.LargeGuestMiB < 128:
		return errors.New("guests must have at least 128 MiB")
	case s.SmallDiskMiB < 64 || s.LargeDiskMiB < 64:
		return errors.New("disks must have at least 64 MiB")
	case len(s.Clones) == 0 || s.Clones[0] != 1:
		return errors.New("clones must start with 1 (the single restore the others are compared with)")
	case s.WarmUp < time.Second:
		return errors.New("warm-up must be at least 1s")
	case s.ChangePercent < 1 || s.ChangePercent > 50:
		return errors.New("change percent must be between 1 and 50")
	case s.LazyFillMiB < 32:
		return errors.New("the lazy guest must fill at least 32 MiB")
	case s.ChunkMiB < 0 || s.ChunkMiB > 64:
		return errors.New("chunk size must be between 1 and 64 MiB")
	case len(s.PauseRAMMiB) < 2:
		return errors.New("pause RAM sizes: want at least two (the rows compare the largest with the smallest)")
	case !ascending(s.PauseRAMMiB):
		return errors.New("pause RAM sizes must be ascending, each once")
	case s.PauseRAMMiB[0] < 64 || s.PauseRAMMiB[len(s.PauseRAMMiB)-1] > 16384:
		return errors.New("pause RAM sizes must be between 64 and 16384 MiB")
	case s.PssClones < 2:
		return errors.New("Pss clones must be at least 2 (compared with one)")
	case s.WarmClones < 2:
		return errors.New("warm clones must be at least 2 (compared with one)")
	case s.WarmFillMiB < 32:
		return errors.New("the warm snapshot must fill at least 32 MiB")
	}
	return nil
}

// ascending reports whether each of v is larger than the one before.
func ascending(v []int) bool {
	for i := 1; i < len(v); i++ {
		if v[i] <= v[i-1] {
			return false
		}
	}
	return true
}

// Options configure Run.
type Options struct {
	Sizes
	Stack stack.Options
	// Progress receives one line per step (nil: discarded).
	Progress io.Writer
	// CPUProfile, when set, receives a CPU profile of the pipeline step
	// (this process: raw hashing, decoding and materializing).
	CPUProfile string
	// KeepLog, when set, receives a copy of containerd's log (the shims'
	// "restore step" lines are there) before the stack is removed.
	KeepLog string
	// Only, when set, runs only the steps whose name contains it, and
	// checks only the hibernation loop's targets, if it ran (the report
	// is then not Complete).
	Only string
	// BootedMemory is the stack's node option `[memory] booted`
	// (configs.BootedOwned or BootedServed; "" is owned): how every booted
	// sandbox of the run holds its RAM. The report's host section says
	// which it was, since the rows keep their names.
	BootedMemory string
}

// withBootedMemory sets the node's [memory] booted of the stack.
func withBootedMemory(booted string) func(*configs.Config) {
	return func(c *configs.Config) { c.Memory.Booted = booted }
}

// bootedMemory is o.BootedMemory, checked ("" is owned).
func (o Options) bootedMemory() (string, error) {
	switch o.BootedMemory {
	case "", configs.BootedOwned:
		return configs.BootedOwned, nil
	case configs.BootedServed:
		return configs.BootedServed, nil
	}
	return "", fmt.Errorf("booted memory %q: must be %s or %s", o.BootedMemory, configs.BootedOwned, configs.BootedServed)
}

type runner struct {
	ctx   context.Context
	s     *stack.Stack
	s3    *stack.S3Server
	o     Options
	r     *Report
	seq   atomic.Int64
	began time.Time

	tpl    template             // idle guest: latency and fan-out
	filled map[int]lazySnapshot // filledSnapshot's, by fill (MiB)
	large  string               // file:// URL of the large guest's first (full) snapshot
	delta  string               // file:// URL of its second snapshot, with delta chunks
}

// Run starts a private containerd with the cryo runtime and an S3 server,
// measures, and stops and removes everything, also when ctx is cancelled
// or a step fails (the report then holds what was measured so far).
func Run(ctx context.Context, o Options) (_ *Report, retErr error) {
	if err := o.Sizes.Validate(); err != nil {
		return nil, err
	}
	booted, err := o.bootedMemory()
	if err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	r := &runner{ctx: ctx, o: o, r: &Report{Sizes: o.Sizes, Only: o.Only}, began: time.Now()}
	defer func() { r.r.Seconds = time.Since(r.began).Seconds() }()

	s3dir, err := os.MkdirTemp("", "cryo-bench-s3-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(s3dir)
	r.s3, err = stack.StartS3(ctx, o.Stack.Tools, s3dir)
	if err != nil {
		return nil, err
	}
	defer r.s3.Close()

	so := o.Stack
	if so.Prefix == "" {
		so.Prefix = "cryo-bench-"
	}
	if so.Namespace == "" {
		so.Namespace = "cryo-bench"
	}
	so.Configure = append(so.Configure, func(c *configs.Config) {
		// The latency, fan-out, pipeline and RSS rows measure eager
		// restores (their targets count materializations); the lazy and
		// hibernation rows ask for lazy by annotation.
		c.Restore.Mode, c.Restore.AllowedModes = configs.RestoreEager, []string{configs.RestoreLazy}
		c.Hypervisor.MemoryMiB = o.GuestMiB
		if o.ChunkMiB > 0 {
			c.Snapshot.ChunkSizeMiB = o.ChunkMiB
		}
		c.Hypervisor.MaxMemoryMiB = max(c.Hypervisor.MaxMemoryMiB, o.LargeGuestMiB, o.LazyFillMiB*5/2, o.WarmFillMiB*5/2, pauseVMMiB(o.PauseRAMMiB[len(o.PauseRAMMiB)-1]))
		c.Stores.Allowed = append(c.Stores.Allowed, "s3://"+r.s3.Bucket+"/")
		c.Stores.S3 = configs.S3{Endpoint: r.s3.Endpoint, AccessKey: r.s3.AccessKey, SecretKey: r.s3.SecretKey, Region: "us-east-1"}
	}, withBootedMemory(booted))
	r.progress("starting containerd with the cryo runtime")
	r.s, err = stack.Start(ctx, so)
	if err != nil {
		return nil, err
	}
	defer func() {
		if o.KeepLog != "" {
			if b, err := os.ReadFile(r.s.LogPath); err == nil {
				_ = os.WriteFile(o.KeepLog, b, 0o600)
			}
		}
		if err := r.s.Close(); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	r.r.Host = host(r.s.Cfg)

	for _, step := range []struct {
		name string
		fn   func() error
	}{
		{"cold boot and restore to first exec", r.latency},
		{"expensive warm-up, cold and restored", r.warmUp},
		{"concurrent restores", r.fanOut},
		{"checkpoint pause windows and incremental checkpoint", r.pauseWindows},
		{"hibernation loop: lazy restore, change, checkpoint", r.hibernate},
		{"restore pipeline throughput", r.pipeline},
		{"lazy and eager restores over a 1 Gbit/s link", r.lazyRestore},
		{"shim peak RSS during a restore", r.shimRSS},
		{"pause and clone memory (issue 21): a writer in the guest", r.pauseRAM},
	} {
		if err := ctx.Err(); err != nil {
			return r.r, err
		}
		if o.Only != "" && !strings.Contains(step.name, o.Only) {
			continue
		}
		r.progress("== %s", step.name)
		if err := step.fn(); err != nil {
			return r.r, fmt.Errorf("%s: %w", step.name, err)
		}
	}
	if o.Only != "" {
		if r.r.value("booted_pause") > 0 {
			r.hibernateTargets()
		}
		if r.r.value("s3_1gbit_large_lazy_to_exec") > 0 {
			r.lazyTargets()
		}
		if _, ok := r.r.Row(idleClones.ratio(o.PssClones)); ok {
			r.pauseRAMTargets()
		}
		return r.r, nil
	}
	r.targets()
	r.r.Complete = true
	return r.r, nil
}

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "%s %s\n", time.Since(r.began).Round(time.Second), fmt.Sprintf(format, args...))
}

func host(c configs.Config) Host {
	h := Host{CPUs: runtime.NumCPU(), Accel: c.Hypervisor.Accel, BootedMemory: c.Memory.Booted, DirtyLimits: dirtyLimits("/proc/sys/vm")}
	if out, err := exec.Command(c.Hypervisor.Path, "--version").Output(); err == nil {
		if m := regexp.MustCompile(`version ([0-9.]+)`).FindStringSubmatch(string(out)); m != nil {
			h.QEMU = m[1]
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	return h
}

// id returns a fresh container id.
func (r *runner) id(prefix string) string { return fmt.Sprintf("%s%d", prefix, r.seq.Add(1)) }

// runArgs builds `ctr run -d` for the cryo runtime with config cfgPath
// ("" for the stack's), annotations and a shell command.
func (r *runner) runArgs(cfgPath, id string, ann map[string]string, script string, extra ...string) []string {
	return r.runImageArgs(stack.Image, cfgPath, id, ann, script, extra...)
}

// runImageArgs is runArgs for another image than the stack's.
func (r *runner) runImageArgs(image, cfgPath, id string, ann map[string]string, script string, extra ...string) []string {
	if cfgPath == "" {
		cfgPath = r.s.ConfigPath
	}
	a := []string{"run", "-d", "--runtime", configs.RuntimeType, "--runtime-config-path", cfgPath}
	for k, v := range ann {
		a = append(a, "--annotation", k+"="+v)
	}
	a = append(a, extra...)
	return append(a, image, id, "sh", "-c", script)
}

// start runs a detached container; extra are more `ctr run` flags.
func (r *runner) start(cfgPath, id string, ann map[string]string, script string, extra ...string) error {
	_, err := r.s.CtrOK(r.runArgs(cfgPath, id, ann, script, extra...)...)
	return err
}

// exec runs a command in the container and returns its stdout.
func (r *runner) exec(id string, args ...string) (string, error) {
	return r.s.CtrOK(append([]string{"task", "exec", "--exec-id", r.id("x"), id}, args...)...)
}

// sh runs a shell script in the container with a long deadline (fills).
func (r *runner) sh(id, script string) error {
	_, err := r.exec(id, "sh", "-c", script)
	return err
}

// remove kills and deletes containers.
func (r *runner) remove(ids ...string) {
	for _, id := range ids {
		_, _, _ = r.s.Ctr("task", "rm", "-f", id)
		_, _, _ = r.s.Ctr("c", "rm", id)
	}
}

// execTiming splits a start-to-first-exec measurement.
type execTiming struct {
	total time.Duration // ctr run -d until the first exec returned
	run   time.Duration // ctr run -d (create: boot or restore; start)
	exec1 time.Duration // the first exec (ctr task exec ... true)
	exec2 time.Duration // a second exec right after (not in total)
}

// startToExec runs a container and returns the time until an exec in it
// has answered; it then times a second exec.
func (r *runner) startToExec(cfgPath, id string, ann map[string]string) (execTiming, error) {
	var t execTiming
	quiesce()
	t0 := time.Now()
	if err := r.start(cfgPath, id, ann, "sleep 100000"); err != nil {
		return t, err
	}
	t.run = time.Since(t0)
	if _, err := r.exec(id, "true"); err != nil {
		return t, err
	}
	t.total = time.Since(t0)
	t.exec1 = t.total - t.run
	t1 := time.Now()
	if _, err := r.exec(id, "true"); err != nil {
		return t, err
	}
	t.exec2 = time.Since(t1)
	return t, nil
}

// addTimings adds the rows name, name_ctr_run, name_first_exec and
// name_second_exec.
func (r *runner) addTimings(group, name string, ts []execTiming) {
	var total, run, e1, e2 []float64
	for _, t := range ts {
		total, run, e1, e2 = append(total, ms(t.total)), append(run, ms(t.run)), append(e1, ms(t.exec1)), append(e2, ms(t.exec2))
	}
	r.r.add(group, name, "ms", total...)
	r.r.add(group, name+"/ctr_run", "ms", run...)
	r.r.add(group, name+"/first_exec", "ms", e1...)
	r.r.add(group, name+"/second_exec", "ms", e2...)
}

func restoreFrom(url string) map[string]string {
	return map[string]string{"cryo.dev/restore-from": url}
}

// ckpt is `cryoctl checkpoint -o json`.
type ckpt struct {
	shimapi.CheckpointReport

	// From the shim's log: the pause window split at "vm state saved":
	// stop, disk freeze (blockdev-snapshot-sync) and device state, then the
	// RAM copy and cont.
	freezeMS, ramMS float64
}

var logTimeRE = regexp.MustCompile(`time="([^"]+)"`)

// splitPause finds the checkpoint of sandbox id in containerd's log after
// off and splits its pause window.
func (r *runner) splitPause(c *ckpt, id string, off int64) {
	b, err := os.ReadFile(r.s.LogPath)
	if err != nil || int64(len(b)) < off {
		return
	}
	var saved, captured time.Time
	for _, l := range strings.Split(string(b[off:]), "\n") {
		if !strings.Contains(l, "sandbox="+id+" ") && !strings.HasSuffix(l, "sandbox="+id) {
			continue
		}
		m := logTimeRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(l, `msg="vm state saved"`):
			saved = t
		case strings.Contains(l, `msg="checkpoint captured"`):
			captured = t
		}
	}
	if saved.IsZero() || captured.IsZero() {
		return
	}
	pause := time.Duration(c.PauseWindowMS) * time.Millisecond
	freeze := saved.Sub(captured.Add(-pause))
	c.freezeMS, c.ramMS = ms(freeze), ms(pause-freeze)
}

func (r *runner) checkpoint(id, to string) (ckpt, error) {
	quiesce()
	return r.checkpointNow(id, to)
}

// checkpointNow is checkpoint without writing back the node's dirty page
// cache first (the caller did, or measures something a sync would move).
func (r *runner) checkpointNow(id, to string) (ckpt, error) {
	var c ckpt
	off := r.logSize()
	out, errs, err := r.s.Cryoctl("-o", "json", "checkpoint", "-n", r.s.Namespace, id, "--to", to)
	if err != nil {
		return c, fmt.Errorf("cryoctl checkpoint %s --to %s: %w: %s%s\ncontainerd log:\n%s", id, to, err, out, errs, r.s.LogTail(20))
	}
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		return c, fmt.Errorf("cryoctl checkpoint output %q: %w", out, err)
	}
	r.splitPause(&c, id, off)
	return c, nil
}

// clearCache empties the node cache: blobs and materialized snapshots.
func (r *runner) clearCache() error {
	for _, d := range []string{filepath.Join(r.s.Cfg.Snapshot.CacheDir, "blobs"), nodecache.SnapshotsDir(r.s.Cfg.Snapshot.CacheDir)} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// cacheBlobBytes is the size of the blobs in the node cache.
func (r *runner) cacheBlobBytes() int64 {
	var n int64
	_ = filepath.WalkDir(filepath.Join(r.s.Cfg.Snapshot.CacheDir, "blobs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".") {
			if st, err := d.Info(); err == nil {
				n += st.Size()
			}
		}
		return nil
	})
	return n
}

// logCount counts lines of containerd's log that contain s, from offset on.
func (r *runner) logCount(s string, from int64) int {
	b, err := os.ReadFile(r.s.LogPath)
	if err != nil || int64(len(b)) < from {
		return 0
	}
	return strings.Count(string(b[from:]), s)
}

func (r *runner) logSize() int64 {
	st, err := os.Stat(r.s.LogPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// cfgWith writes a variant of the stack's cryo config and returns its path.
func (r *runner) cfgWith(name string, f func(*configs.Config)) (string, error) {
	c := r.s.Cfg
	f(&c)
	p := filepath.Join(r.s.Dir, name+".toml")
	return p, r.s.WriteConfig(p, c)
}

// quiesce writes back the node's dirty page cache before a measurement:
// the previous step's files (flattened disks, uploaded blobs, materialized
// snapshots) would otherwise be written back during it, and the kernel's
// flusher would take CPU from what is measured, more after a larger step.
// Checkpoints and restores of one sandbox are minutes apart in use, not
// back to back.
func quiesce() { unix.Sync() }
