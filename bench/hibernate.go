package bench

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/cryo-runtime/cryo/configs"
)

// hibernateGens is the number of restore-change-checkpoint rounds of the
// hibernation loop (issue #14).
const hibernateGens = 5

// hibernate: the hibernation loop. Boot the large guest, warm it up (a
// tenth of its RAM filled with random data), checkpoint; then five times:
// restore lazily, change 1% of RAM, checkpoint. Per generation: bytes
// uploaded per byte changed and the pause window; restore to first exec
// of generations 1 and 5.
func (r *runner) hibernate() error {
	mem := r.o.LargeGuestMiB
	ann := map[string]string{"cryo.dev/memory": strconv.Itoa(mem)}
	tmpfs := fmt.Sprintf("type=tmpfs,src=tmpfs,dst=/fill,options=size=%dm:rw", mem)
	id := r.id("hib")
	if err := r.start("", id, ann, "sleep 100000", "--mount", tmpfs); err != nil {
		return err
	}
	fill := max(2, mem/10)
	if err := r.sh(id, fmt.Sprintf("dd if=/dev/urandom of=/fill/ram bs=1M count=%d 2>/dev/null && sync", fill)); err != nil {
		r.remove(id)
		return err
	}
	prev := r.s.StoreURL("hib:g0")
	c, err := r.checkpoint(id, prev)
	r.remove(id)
	if err != nil {
		return err
	}
	r.r.add("hibernate", "booted_pause", "ms", float64(c.PauseWindowMS))
	r.r.add("hibernate", "booted_uploaded", "MiB", mib(c.UploadedBytes))
	r.progress("hibernation loop: booted checkpoint, pause %d ms, %.1f MiB uploaded", c.PauseWindowMS, mib(c.UploadedBytes))
	change := max(1, mem/100)
	for g := 1; g <= hibernateGens; g++ {
		if prev, err = r.hibernateGen(g, prev, change, fill); err != nil {
			return fmt.Errorf("generation %d: %w", g, err)
		}
	}
	return nil
}

// hibernateGen restores prev lazily, changes change MiB of the filled
// RAM (a different MiB range each generation), checkpoints and returns
// the new snapshot.
func (r *runner) hibernateGen(g int, prev string, change, fill int) (string, error) {
	id := r.id("hib")
	ann := restoreFrom(prev)
	ann["cryo.dev/restore-mode"] = configs.RestoreLazy
	t, err := r.startToExec("", id, ann)
	defer r.remove(id)
	if err != nil {
		return "", err
	}
	seek := (g * change) % max(1, fill-change)
	// 64 KiB at a time: dd's own buffer is RAM the guest writes too.
	if err := r.sh(id, fmt.Sprintf("dd if=/dev/urandom of=/fill/ram bs=64k count=%d seek=%d conv=notrunc 2>/dev/null", change*16, seek*16)); err != nil {
		return "", err
	}
	next := r.s.StoreURL(fmt.Sprintf("hib:g%d", g))
	off := r.logSize()
	c, err := r.checkpoint(id, next)
	if err != nil {
		return "", err
	}
	dirty := r.dirtyBytes(id, off)
	per := mib(c.UploadedBytes) / float64(change)
	p := fmt.Sprintf("gen%d_", g)
	r.r.add("hibernate", p+"restore_to_exec", "ms", ms(t.total))
	r.r.add("hibernate", p+"pause", "ms", float64(c.PauseWindowMS))
	r.r.add("hibernate", p+"uploaded", "MiB", mib(c.UploadedBytes))
	r.r.add("hibernate", p+"uploaded_per_changed_byte", "ratio", per)
	r.r.add("hibernate", p+"delta_chunks", "count", float64(c.DeltaChunks))
	// What the guest wrote is more than the workload's change: dd's
	// buffer, the kernel's and the agent's own pages.
	if dirty > 0 {
		r.r.add("hibernate", p+"ram_dirty", "MiB", mib(dirty))
		r.r.add("hibernate", p+"uploaded_per_dirty_byte", "ratio", float64(c.UploadedBytes)/float64(dirty))
	}
	r.progress("hibernation loop: generation %d restored to first exec in %.0f ms; %d MiB changed (%.1f MiB of RAM pages written), %.2f MiB uploaded (%.2fx), %d deltas, pause %d ms",
		g, ms(t.total), change, mib(dirty), mib(c.UploadedBytes), per, c.DeltaChunks, c.PauseWindowMS)
	return next, nil
}

var dirtyRE = regexp.MustCompile(`msg="checkpoint of served ram published".* dirty_bytes=(\d+)`)

// dirtyBytes reads the RAM pages written since the parent from the shim's
// log line of sandbox id's checkpoint, after offset off (0: not found).
func (r *runner) dirtyBytes(id string, off int64) int64 {
	b, err := os.ReadFile(r.s.LogPath)
	if err != nil || int64(len(b)) < off {
		return 0
	}
	for _, l := range strings.Split(string(b[off:]), "\n") {
		if !strings.Contains(l, "sandbox="+id+" ") && !strings.HasSuffix(l, "sandbox="+id) {
			continue
		}
		if m := dirtyRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			return n
		}
	}
	return 0
}

// hibernateTargets checks the targets of the loop: every
// generation uploads at most 1.2x what changed (plus the device state),
// pauses at most 1.2x the booted checkpoint, and generation 5 restores
// within 1.1x of generation 1.
func (r *runner) hibernateTargets() {
	rep := r.r
	booted := rep.value("booted_pause")
	worstUp, worstPause := 0.0, 0.0
	for g := 1; g <= hibernateGens; g++ {
		p := fmt.Sprintf("gen%d_", g)
		worstUp = max(worstUp, rep.value(p+"uploaded_per_changed_byte"))
		if booted > 0 {
			worstPause = max(worstPause, rep.value(p+"pause")/booted)
		}
	}
	rep.target("hibernation loop: uploaded per byte changed, worst generation", "<= 1.20", worstUp, worstUp > 0 && worstUp <= 1.2,
		"includes the device state and the disks' changed chunks")
	rep.target("hibernation loop: pause window / booted, worst generation", "<= 1.20", worstPause, worstPause > 0 && worstPause <= 1.2,
		fmt.Sprintf("booted %.0f ms", booted))
	g1, g5 := rep.value("gen1_restore_to_exec"), rep.value(fmt.Sprintf("gen%d_restore_to_exec", hibernateGens))
	rr := 0.0
	if g1 > 0 {
		rr = g5 / g1
	}
	rep.target(fmt.Sprintf("hibernation loop: restore of generation %d / generation 1", hibernateGens), "<= 1.10", rr, rr > 0 && rr <= 1.1,
		fmt.Sprintf("%.0f ms vs %.0f ms", g5, g1))
}
