package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/nodeopts"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/stack"
)

// linkRate is the shaped link between the node and its S3 store.
const linkRate = "1gbit"

// lazySnapshot is one snapshot the lazy-restore rows restore.
type lazySnapshot struct {
	name   string // "small", "large"
	url    string // s3://
	stored int64
}

// lazyRestore: restore to first exec from S3 over a loopback link shaped
// to 1 Gbit/s (the S3 port only), the node cache empty, for a small
// snapshot (the idle template) and a large one (a guest that filled
// LazyFillMiB of RAM with compressible data), eager and lazy, with the
// bytes that crossed the link before the first exec answered; then lazy
// from the node cache, the floor (the same QEMU started directly from the
// materialized files, sandbox.Floor), and concurrent lazy clones with the
// bytes they fetched together.
func (r *runner) lazyRestore() error {
	small, err := r.smallLazySnapshot()
	if err != nil {
		return err
	}
	large, err := r.largeLazySnapshot()
	if err != nil {
		return err
	}
	snaps := []lazySnapshot{small, large}
	link, err := stack.ShapeEndpoint(r.s3.Endpoint, linkRate)
	if err != nil {
		return err
	}
	defer link.Remove()
	for _, s := range snaps {
		if err := r.shapedRestores(link, s); err != nil {
			return err
		}
	}
	if err := r.cachedLazy(large); err != nil {
		return err
	}
	if err := r.floor(large); err != nil {
		return err
	}
	return r.lazyClones(link, large)
}

// smallLazySnapshot is the idle template in S3: the latency step's, or,
// when this run skipped it (--only), one made here the same way.
func (r *runner) smallLazySnapshot() (lazySnapshot, error) {
	if r.tpl.s3 == "" {
		id := r.id("tpl")
		if err := r.startIdle(id); err != nil {
			return lazySnapshot{}, err
		}
		c, err := r.checkpoint(id, r.templateS3())
		r.remove(id)
		if err != nil {
			return lazySnapshot{}, err
		}
		r.tpl.s3, r.tpl.stored = r.templateS3(), c.StoredBytes
	}
	return lazySnapshot{"small", r.tpl.s3, r.tpl.stored}, nil
}

// largeLazySnapshot checkpoints a guest that filled LazyFillMiB of its RAM
// (tmpfs) with compressible data to S3.
func (r *runner) largeLazySnapshot() (lazySnapshot, error) {
	fill := r.o.LazyFillMiB
	s, err := r.filledSnapshot(fill)
	if err != nil {
		return lazySnapshot{}, err
	}
	r.r.add("lazy", "large_snapshot_stored", "MiB", mib(s.stored))
	r.r.add("lazy", "large_snapshot_ram", "MiB", float64(fillVMMiB(fill)))
	r.progress("lazy: large snapshot, %d MiB guest with %d MiB filled: %.0f MiB stored", fillVMMiB(fill), fill, mib(s.stored))
	return s, nil
}

// fillVMMiB is the RAM of a guest that fills fill MiB of its tmpfs.
func fillVMMiB(fill int) int { return fill * 5 / 2 }

// fillRndMiB is the incompressible part of a fill of fill MiB.
func fillRndMiB(fill int) int { return min(fill/4, 128) }

// fillPath is where a filled guest's data is (fillScript's path): the
// files fillPath.rnd and fillPath.txt.
const fillPath = "/fill/ram"

// filledSnapshot checkpoints to S3 a guest that filled fill MiB of its RAM
// (tmpfs at /fill) with compressible data, once per run and fill: the
// lazy rows' large snapshot and issue 21's warm one are the same when
// their fills are.
func (r *runner) filledSnapshot(fill int) (lazySnapshot, error) {
	if s, ok := r.filled[fill]; ok {
		return s, nil
	}
	mem := fillVMMiB(fill)
	id := r.id("lazy")
	ann := map[string]string{"cryo.dev/memory": strconv.Itoa(mem)}
	tmpfs := fmt.Sprintf("type=tmpfs,src=tmpfs,dst=/fill,options=size=%dm:rw", mem)
	if err := r.start("", id, ann, "sleep 100000", "--mount", tmpfs); err != nil {
		return lazySnapshot{}, err
	}
	defer r.remove(id)
	if err := r.sh(id, fillScript(fillPath, fill, fillRndMiB(fill), false)); err != nil {
		return lazySnapshot{}, err
	}
	url := fmt.Sprintf("s3://%s/bench/lazy-large-%dmib:v1", r.s3.Bucket, fill)
	c, err := r.checkpoint(id, url)
	if err != nil {
		return lazySnapshot{}, err
	}
	s := lazySnapshot{"large", url, c.StoredBytes}
	if r.filled == nil {
		r.filled = make(map[int]lazySnapshot)
	}
	r.filled[fill] = s
	return s, nil
}

func modeAnn(url, mode string) map[string]string {
	return map[string]string{annotations.RestoreFrom: url, annotations.RestoreMode: mode}
}

// shapedRestores: Runs restores of s over the link in each mode, each
// with an empty node cache. The modes take turns, so that the machine's
// drift during a run (page cache, CPU frequency, the other core) falls on
// both alike.
func (r *runner) shapedRestores(link *stack.Link, s lazySnapshot) error {
	modes := []string{configs.RestoreEager, configs.RestoreLazy}
	ts := make(map[string][]execTiming)
	fetched := make(map[string][]float64)
	for range r.o.Runs {
		for _, mode := range modes {
			t, f, err := r.shapedRestore(link, s, mode)
			if err != nil {
				return err
			}
			ts[mode], fetched[mode] = append(ts[mode], t), append(fetched[mode], f)
		}
	}
	for _, mode := range modes {
		name := fmt.Sprintf("s3_1gbit_%s_%s_to_exec", s.name, mode)
		f := fetched[mode]
		r.addTimings("lazy", name, ts[mode])
		r.r.add("lazy", name+"/fetched", "MiB", f...)
		r.r.add("lazy", name+"/fetched_of_stored", "%", 100*Median(f)/mib(max(1, s.stored)))
		r.progress("lazy: %s snapshot, %s, S3 over %s: %.0f ms to first exec, %.1f MiB fetched (%.0f%% of %.0f MiB stored)",
			s.name, mode, linkRate, r.r.value(name), Median(f), 100*Median(f)/mib(max(1, s.stored)), mib(s.stored))
	}
	return nil
}

// shapedRestore is one restore of s in mode over the link, the node cache
// empty: its timings, and the MiB that crossed the link, measured after
// the second exec too (an upper bound of what the first one needed).
func (r *runner) shapedRestore(link *stack.Link, s lazySnapshot, mode string) (execTiming, float64, error) {
	if err := r.clearCache(); err != nil {
		return execTiming{}, 0, err
	}
	before, err := link.Bytes()
	if err != nil {
		return execTiming{}, 0, err
	}
	id := r.id("lz")
	t, err := r.startToExec("", id, modeAnn(s.url, mode))
	after, berr := link.Bytes()
	r.remove(id)
	if err != nil {
		return execTiming{}, 0, err
	}
	if berr != nil {
		return execTiming{}, 0, berr
	}
	return t, mib(after - before), nil
}

// cachedLazy: lazy restores of s with its blobs in the node cache.
func (r *runner) cachedLazy(s lazySnapshot) error {
	if err := r.clearCache(); err != nil {
		return err
	}
	warm := r.id("lzw")
	_, err := r.startToExec("", warm, modeAnn(s.url, configs.RestoreEager))
	r.remove(warm)
	if err != nil {
		return err
	}
	var ts []execTiming
	for range r.o.Runs {
		id := r.id("lzc")
		t, err := r.startToExec("", id, modeAnn(s.url, configs.RestoreLazy))
		r.remove(id)
		if err != nil {
			return err
		}
		ts = append(ts, t)
	}
	name := fmt.Sprintf("cached_%s_lazy_to_exec", s.name)
	r.addTimings("lazy", name, ts)
	r.progress("lazy: %s snapshot from the node cache: %.0f ms to first exec", s.name, r.r.value(name))
	return nil
}

// floor: sandbox.Floor on s, whose files the node cache holds (cachedLazy
// restored it eagerly once).
func (r *runner) floor(s lazySnapshot) error {
	quiet := logrus.New()
	quiet.Out = io.Discard
	ctx := log.WithLogger(r.ctx, logrus.NewEntry(quiet))
	node, err := nodeopts.Sandbox(r.s.Cfg)
	if err != nil {
		return err
	}
	var v []float64
	for i := range r.o.Runs {
		id := fmt.Sprintf("floor%d", i)
		spec := sandbox.Spec{
			ID: id, Node: node, StateDir: filepath.Join(r.s.StateRoot, "floor", strconv.Itoa(i)),
			DiskDir: filepath.Join(r.s.Dir, "floor-disks", strconv.Itoa(i)), Pod: &specs.Spec{},
			RestoreMode: sandbox.RestoreEager, Tenant: r.s.Namespace,
		}
		quiesce()
		d, err := sandbox.Floor(ctx, spec, sandbox.Source{URL: s.url})
		if err != nil {
			return err
		}
		v = append(v, ms(d))
	}
	name := fmt.Sprintf("floor_%s_to_first_command", s.name)
	r.r.add("lazy", name, "ms", v...)
	r.progress("lazy: floor, QEMU started directly from the %s snapshot's materialized files: %.0f ms to a first command", s.name, Median(v))
	return nil
}

// lazyClones: the largest fan-out of lazy restores of s at once, the node
// cache empty: the bytes that crossed the link against one restore's.
func (r *runner) lazyClones(link *stack.Link, s lazySnapshot) error {
	n := r.o.Clones[len(r.o.Clones)-1]
	if err := r.clearCache(); err != nil {
		return err
	}
	before, err := link.Bytes()
	if err != nil {
		return err
	}
	off := r.logSize()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range ids {
		ids[i] = r.id("lzf")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = r.start("", ids[i], modeAnn(s.url, configs.RestoreLazy), "sleep 100000"); errs[i] == nil {
				_, errs[i] = r.exec(ids[i], "true")
			}
		}()
	}
	wg.Wait()
	last := time.Since(t0)
	// Let the prefetches finish: every chunk once, whoever asked first.
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
	defer cancel()
	for ctx.Err() == nil && r.logCount("prefetch complete", off) < n {
		time.Sleep(500 * time.Millisecond)
	}
	after, berr := link.Bytes()
	mem := procsMem(r.s.QEMUPids())
	r.remove(ids...)
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("lazy clone %d of %d: %w", i+1, n, err)
		}
	}
	if berr != nil {
		return berr
	}
	r.r.add("lazy", fmt.Sprintf("clones_%d_last_to_exec", n), "ms", ms(last))
	r.r.add("lazy", fmt.Sprintf("clones_%d_fetched_of_stored", n), "ratio", float64(after-before)/float64(max(1, s.stored)))
	r.r.add("lazy", fmt.Sprintf("clones_%d_qemu_pss_total", n), "MiB", mib(mem.pss))
	r.progress("lazy: %d clones of the %s snapshot: last answered after %.0f ms; %.2fx the stored bytes crossed the link; QEMU Pss %.0f MiB",
		n, s.name, ms(last), float64(after-before)/float64(max(1, s.stored)), mib(mem.pss))
	return nil
}
