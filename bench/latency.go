package bench

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// template is the snapshot of an idle guest that the latency and fan-out
// rows restore.
type template struct {
	file, s3 string
	stored   int64
}

// latency: cold boot to first exec, and restore to first exec with the
// snapshot in the node cache, from a file:// store and from S3.
func (r *runner) latency() error {
	var cold []execTiming
	for range r.o.Runs {
		id := r.id("cold")
		t, err := r.startToExec("", id, nil)
		r.remove(id)
		if err != nil {
			return err
		}
		cold = append(cold, t)
	}
	r.addTimings("latency", "cold_boot_to_exec", cold)
	r.progress("cold boot to first exec: %.0f ms", r.r.value("cold_boot_to_exec"))

	tpl := r.id("tpl")
	defer r.remove(tpl)
	if err := r.startIdle(tpl); err != nil {
		return err
	}
	r.tpl = template{file: r.s.StoreURL("tpl:v1"), s3: r.templateS3()}
	c, err := r.checkpoint(tpl, r.tpl.file)
	if err != nil {
		return err
	}
	r.tpl.stored = c.StoredBytes
	if _, err := r.checkpoint(tpl, r.tpl.s3); err != nil {
		return err
	}
	r.remove(tpl)
	r.r.add("latency", "template_snapshot_stored", "MiB", mib(c.StoredBytes))

	restore := func(name, url string, cached bool) error {
		var v []execTiming
		if cached {
			// Put the snapshot in the node cache (blobs and materialized
			// files) with one restore that is not counted.
			if err := r.clearCache(); err != nil {
				return err
			}
			id := r.id("warm")
			_, err := r.startToExec("", id, restoreFrom(url))
			r.remove(id)
			if err != nil {
				return err
			}
		}
		for range r.o.Runs {
			if !cached {
				if err := r.clearCache(); err != nil {
					return err
				}
			}
			id := r.id("rst")
			t, err := r.startToExec("", id, restoreFrom(url))
			r.remove(id)
			if err != nil {
				return err
			}
			v = append(v, t)
		}
		r.addTimings("latency", name, v)
		r.progress("%s: %.0f ms", name, r.r.value(name))
		return nil
	}
	if err := restore("restore_to_exec_cached", r.tpl.file, true); err != nil {
		return err
	}
	if err := restore("restore_to_exec_file", r.tpl.file, false); err != nil {
		return err
	}
	return restore("restore_to_exec_s3", r.tpl.s3, false)
}

// startIdle starts the idle guest the template snapshot is taken of,
// once it has answered an exec.
func (r *runner) startIdle(id string) error {
	if err := r.start("", id, nil, "sleep 100000"); err != nil {
		return err
	}
	_, err := r.exec(id, "true")
	return err
}

// templateS3 is where the idle template's snapshot is in S3.
func (r *runner) templateS3() string { return "s3://" + r.s3.Bucket + "/bench/tpl:v1" }

// warmScript spends %d seconds building state in memory (a counter and a
// growing table in /dev/shm) before it answers: /dev/shm/ready appears.
const warmScript = `end=$(( $(date +%%s) + %d )); n=0
while [ $(date +%%s) -lt $end ]; do n=$((n+1)); echo "row $n $RANDOM $RANDOM" >> /dev/shm/table; done
echo $n > /dev/shm/ready
exec sleep 100000`

// waitReady polls the warm-up workload until it answers.
func (r *runner) waitReady(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, _, err := r.s.Ctr("task", "exec", "--exec-id", r.id("p"), id, "cat", "/dev/shm/ready")
		if err == nil && strings.TrimSpace(out) != "" {
			return nil
		}
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workload %s did not answer within %s: %v", id, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// warmUp: the expensive workload, cold (boot + warm-up) and restored from
// a snapshot taken once it answered (the node cache empty: fetched from the
// file store).
func (r *runner) warmUp() error {
	script := fmt.Sprintf(warmScript, int(r.o.WarmUp.Seconds()))
	var cold []float64
	var last string
	for i := range r.o.Runs {
		id := r.id("warm")
		t0 := time.Now()
		if err := r.start("", id, nil, script); err != nil {
			return err
		}
		err := r.waitReady(id, r.o.WarmUp+3*time.Minute)
		if err != nil {
			r.remove(id)
			return err
		}
		cold = append(cold, ms(time.Since(t0)))
		if i < r.o.Runs-1 {
			r.remove(id)
		} else {
			last = id
		}
	}
	r.r.add("warm-up", "warmup_cold_to_answer", "ms", cold...)
	r.progress("warm-up workload, cold: %.0f ms", Median(cold))
	url := r.s.StoreURL("warm:v1")
	_, err := r.checkpoint(last, url)
	r.remove(last)
	if err != nil {
		return err
	}
	var warm []float64
	for range r.o.Runs {
		if err := r.clearCache(); err != nil {
			return err
		}
		id := r.id("wrst")
		t0 := time.Now()
		if err := r.start("", id, restoreFrom(url), "sleep 100000"); err != nil {
			return err
		}
		err := r.waitReady(id, time.Minute)
		r.remove(id)
		if err != nil {
			return err
		}
		warm = append(warm, ms(time.Since(t0)))
	}
	r.r.add("warm-up", "warmup_restore_to_answer", "ms", warm...)
	r.progress("warm-up workload, restored: %.0f ms", Median(warm))
	return nil
}

// fanOut: n restores of the template at once, the node cache empty: the
// wall time until the last one answered an exec, the bytes the node cache
// downloaded, how many restores materialized, and the memory of the QEMU
// processes (Pss counts shared page cache once), and the CPU time the
// QEMUs and shims used (restore and exec): against the wall time and the
// number of cores it says whether the fan-out is CPU-bound.
func (r *runner) fanOut() error {
	for _, n := range r.o.Clones {
		var lastMS []float64
		var dl int64
		var misses int
		var mem procMem
		var cpu, qcpu time.Duration
		for range r.o.Runs {
			if err := r.clearCache(); err != nil {
				return err
			}
			off := r.logSize()
			ids := make([]string, n)
			for i := range ids {
				ids[i] = r.id(fmt.Sprintf("fan%d-", n))
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			took := make([]time.Duration, n)
			quiesce()
			t0 := time.Now()
			for i, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if errs[i] = r.start("", id, restoreFrom(r.tpl.file), "sleep 100000"); errs[i] == nil {
						_, errs[i] = r.exec(id, "true")
					}
					took[i] = time.Since(t0)
				}()
			}
			wg.Wait()
			mem = procsMem(r.s.QEMUPids())
			qcpu = cpuTime(r.s.QEMUPids())
			cpu = qcpu + cpuTime(r.s.ShimPids())
			r.remove(ids...)
			var worst time.Duration
			for i := range ids {
				if errs[i] != nil {
					return fmt.Errorf("restore %d of %d: %w", i+1, n, errs[i])
				}
				worst = max(worst, took[i])
			}
			lastMS = append(lastMS, ms(worst))
			dl = r.cacheBlobBytes()
			misses = r.logCount("cache_hit=false", off)
		}
		p := fmt.Sprintf("fanout_%d_", n)
		r.r.add("fan-out", p+"last_to_exec", "ms", lastMS...)
		r.r.add("fan-out", p+"downloaded", "MiB", mib(dl))
		r.r.add("fan-out", p+"materializations", "count", float64(misses))
		r.r.add("fan-out", p+"qemu_pss_total", "MiB", mib(mem.pss))
		r.r.add("fan-out", p+"qemu_rss_total", "MiB", mib(mem.rss))
		r.r.add("fan-out", p+"cpu_total", "ms", ms(cpu))
		r.r.add("fan-out", p+"cpu_qemu", "ms", ms(qcpu))
		r.progress("%d concurrent restores: last %.0f ms, %.1f MiB downloaded, %d materializations, QEMU Pss %.0f MiB Rss %.0f MiB",
			n, Median(lastMS), mib(dl), misses, mib(mem.pss), mib(mem.rss))
	}
	return nil
}
