package bench

import (
	"fmt"
	"slices"
)

// shimRSS: the shim's peak RSS (VmHWM) over a restore of the large guest's
// second snapshot (full and delta chunks) with an empty node cache (the
// shim fetches, verifies, applies the deltas and materializes),
// and the QEMU's RSS right after.
func (r *runner) shimRSS() error {
	var peak, qrss []float64
	for range r.o.Runs {
		if err := r.clearCache(); err != nil {
			return err
		}
		before := r.s.ShimPids()
		id := r.id("rss")
		if _, err := r.startToExec("", id, restoreFrom(r.delta)); err != nil {
			r.remove(id)
			return err
		}
		var hwm int64
		for _, pid := range r.s.ShimPids() {
			if !slices.Contains(before, pid) {
				hwm = max(hwm, vmHWM(pid))
			}
		}
		q := procsMem(r.s.QEMUPids())
		r.remove(id)
		if hwm == 0 {
			return fmt.Errorf("no shim process found for %s", id)
		}
		peak = append(peak, mib(hwm))
		qrss = append(qrss, mib(q.rss))
	}
	r.r.add("memory", fmt.Sprintf("shim_peak_rss_restore_%dMiB", r.o.LargeGuestMiB), "MiB", peak...)
	r.r.add("memory", fmt.Sprintf("qemu_rss_after_restore_%dMiB", r.o.LargeGuestMiB), "MiB", qrss...)
	r.progress("shim peak RSS during a %d MiB restore: %.0f MiB (QEMU RSS %.0f MiB)", r.o.LargeGuestMiB, Median(peak), Median(qrss))
	return nil
}

// targets checks the performance goals on this run's rows.
func (r *runner) targets() {
	rep := r.r
	cold := rep.value("cold_boot_to_exec")
	cached := ratio(rep.value("restore_to_exec_cached"), cold)
	rep.target("restore_to_exec / cold_boot_to_exec", "<= 0.10", cached, cached > 0 && cached <= 0.10,
		fmt.Sprintf("cached %.0f ms, file %.0f ms (%.2fx), s3 %.0f ms (%.2fx), cold %.0f ms",
			rep.value("restore_to_exec_cached"), rep.value("restore_to_exec_file"), ratio(rep.value("restore_to_exec_file"), cold),
			rep.value("restore_to_exec_s3"), ratio(rep.value("restore_to_exec_s3"), cold), cold))

	n := r.o.Clones[len(r.o.Clones)-1]
	p := fmt.Sprintf("fanout_%d_", n)
	last := ratio(rep.value(p+"last_to_exec"), rep.value("fanout_1_last_to_exec"))
	dl := ratio(rep.value(p+"downloaded"), mib(r.tpl.stored))
	mats := rep.value(p + "materializations")
	rep.target(fmt.Sprintf("%d concurrent restores: last / single", n), "<= 2.0, one download", last,
		last > 0 && last <= 2 && mats == 1 && dl <= 1.1,
		fmt.Sprintf("last %.0f ms vs single %.0f ms; downloaded %.1f MiB = %.2fx the snapshot's %.1f MiB; %.0f materialization(s); QEMU+shim CPU %.0f ms (QEMU %.0f ms) on %d CPUs",
			rep.value(p+"last_to_exec"), rep.value("fanout_1_last_to_exec"), rep.value(p+"downloaded"), dl, mib(r.tpl.stored), mats,
			rep.value(p+"cpu_total"), rep.value(p+"cpu_qemu"), rep.Host.CPUs))

	sha, zs, pipe := rep.value("raw_sha256"), rep.value("raw_zstd_decode"), rep.value("fetch_verify_materialize")
	pr := ratio(pipe, min(sha, zs))
	rep.target("pipeline / min(raw sha256, raw zstd decode)", ">= 0.80", pr, pr >= 0.8,
		fmt.Sprintf("pipeline %.0f MiB/s, sha256 %.0f MiB/s, zstd decode %.0f MiB/s", pipe, sha, zs))

	small, large := rep.value(fmt.Sprintf("pause_disk_%dMiB", r.o.SmallDiskMiB)), rep.value(fmt.Sprintf("pause_disk_%dMiB", r.o.LargeDiskMiB))
	dr := ratio(large, small)
	rep.target(fmt.Sprintf("pause window %d MiB disk / %d MiB disk", r.o.LargeDiskMiB, r.o.SmallDiskMiB), "<= 1.20", dr, dr > 0 && dr <= 1.2,
		fmt.Sprintf("%.0f ms vs %.0f ms (stop+freeze+devstate %.1f vs %.1f ms, the rest is the RAM copy); guests: %d MiB %.0f ms, %d MiB %.0f ms", large, small,
			rep.value(fmt.Sprintf("pause_disk_%dMiB/stop_freeze_devstate", r.o.LargeDiskMiB)), rep.value(fmt.Sprintf("pause_disk_%dMiB/stop_freeze_devstate", r.o.SmallDiskMiB)),
			r.o.SmallGuestMiB, rep.value(fmt.Sprintf("pause_guest_%dMiB", r.o.SmallGuestMiB)),
			r.o.LargeGuestMiB, rep.value(fmt.Sprintf("pause_guest_%dMiB", r.o.LargeGuestMiB))))

	ir := ratio(rep.value("second_checkpoint_uploaded"), rep.value("first_checkpoint_uploaded"))
	rep.target(fmt.Sprintf("second checkpoint after %d%% RAM change / first (uploaded)", r.o.ChangePercent), "<= 0.10", ir, ir > 0 && ir <= 0.10,
		fmt.Sprintf("%.1f MiB vs %.1f MiB; %.0f of %.0f chunks (%.0f as deltas); %.2f bytes uploaded per (random, incompressible) byte changed", rep.value("second_checkpoint_uploaded"), rep.value("first_checkpoint_uploaded"),
			rep.value("second_chunks_uploaded"), rep.value("chunks"), rep.value("second_delta_chunks"), rep.value("second_uploaded_per_changed_byte")))

	r.hibernateTargets()

	rss := rep.value(fmt.Sprintf("shim_peak_rss_restore_%dMiB", r.o.LargeGuestMiB))
	rep.target(fmt.Sprintf("shim peak RSS, %d MiB restore (MiB)", r.o.LargeGuestMiB), "<= 256", rss, rss > 0 && rss <= 256,
		fmt.Sprintf("QEMU RSS after restore %.0f MiB", rep.value(fmt.Sprintf("qemu_rss_after_restore_%dMiB", r.o.LargeGuestMiB))))

	r.lazyTargets()
	r.pauseRAMTargets()
}

// ratio is a / b, 0 when b is (a row that did not run).
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// lazyTargets are issue 13's: lazy restore time does not grow with the
// snapshot, fetches a small part of it before the first exec, is close to
// the floor from the node cache, and clones fetch each byte once.
func (r *runner) lazyTargets() {
	rep := r.r
	ls, ll := rep.value("s3_1gbit_small_lazy_to_exec"), rep.value("s3_1gbit_large_lazy_to_exec")
	el := rep.value("s3_1gbit_large_eager_to_exec")
	v := ratio(ll, ls)
	rep.target("lazy large / lazy small (S3, 1 Gbit/s)", "<= 1.5", v, v > 0 && v <= 1.5,
		fmt.Sprintf("large %.0f ms, small %.0f ms; eager: large %.0f ms, small %.0f ms", ll, ls, el, rep.value("s3_1gbit_small_eager_to_exec")))
	v = ratio(ll, el)
	rep.target("lazy large / eager large (S3, 1 Gbit/s)", "<= 0.25", v, v > 0 && v <= 0.25, fmt.Sprintf("%.0f ms vs %.0f ms", ll, el))
	f := rep.value("s3_1gbit_large_lazy_to_exec/fetched_of_stored")
	rep.target("lazy large: fetched before the first exec / stored (%)", "<= 15", f, f > 0 && f <= 15,
		fmt.Sprintf("%.1f MiB of %.0f MiB stored", rep.value("s3_1gbit_large_lazy_to_exec/fetched"), rep.value("large_snapshot_stored")))
	fl := rep.value("floor_large_to_first_command")
	v = ratio(rep.value("cached_large_lazy_to_exec"), fl)
	rep.target("lazy from the node cache / floor", "<= 1.2", v, v > 0 && v <= 1.2,
		fmt.Sprintf("lazy %.0f ms, floor (QEMU from the materialized files, a first command) %.0f ms", rep.value("cached_large_lazy_to_exec"), fl))
	n := r.o.Clones[len(r.o.Clones)-1]
	v = rep.value(fmt.Sprintf("clones_%d_fetched_of_stored", n))
	rep.target(fmt.Sprintf("%d lazy clones: fetched / stored", n), "<= 1.1", v, v > 0 && v <= 1.1,
		fmt.Sprintf("last answered after %.0f ms; QEMU Pss %.0f MiB", rep.value(fmt.Sprintf("clones_%d_last_to_exec", n)), rep.value(fmt.Sprintf("clones_%d_qemu_pss_total", n))))
}
