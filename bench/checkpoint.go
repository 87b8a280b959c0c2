package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cryo-runtime/cryo/configs"
)

// busyboxSize is the size of the guest's /bin/busybox (the host's, which
// the test image copies): copies of it are cheap, compressible filler.
func busyboxSize() int64 {
	if st, err := os.Stat("/bin/busybox"); err == nil && st.Size() > 0 {
		return st.Size()
	}
	return 2 << 20
}

// fillScript writes about mib MiB to path: rnd MiB from /dev/urandom
// (slow under TCG, incompressible) to path.rnd, the rest copies of
// /bin/busybox (fast, compresses about 2:1) to path.txt. With direct the
// writes bypass the guest's page cache (O_DIRECT), so that filling a disk
// does not also fill guest RAM.
func fillScript(path string, mib, rnd int, direct bool) string {
	copies := (int64(mib-rnd) << 20) / busyboxSize()
	flag := ""
	if direct {
		flag = " oflag=direct"
	}
	return fmt.Sprintf(`dd if=/dev/urandom of=%s.rnd bs=1M count=%d%s 2>/dev/null && i=0 && while [ $i -lt %d ]; do cat /bin/busybox; i=$((i+1)); done | dd of=%s.txt bs=1M iflag=fullblock%s 2>/dev/null && sync`,
		path, rnd, flag, copies, path, flag)
}

// pauseWindows: checkpoint pause windows of a small and a large guest
// (40% of RAM filled) and of a small and a large writable disk (1/8
// filled, bypassing the guest page cache so the guests' RAM is alike); on the large guest also the incremental checkpoint: a second
// checkpoint after ChangePercent of RAM changed, against the first.
func (r *runner) pauseWindows() error {
	for _, mem := range []int{r.o.SmallGuestMiB, r.o.LargeGuestMiB} {
		if err := r.pauseGuest(mem, mem == r.o.LargeGuestMiB); err != nil {
			return err
		}
	}
	for _, disk := range []int{r.o.SmallDiskMiB, r.o.LargeDiskMiB} {
		if err := r.pauseDisk(disk); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) pauseGuest(mem int, large bool) error {
	id := r.id(fmt.Sprintf("mem%d-", mem))
	ann := map[string]string{"cryo.dev/memory": strconv.Itoa(mem)}
	tmpfs := fmt.Sprintf("type=tmpfs,src=tmpfs,dst=/fill,options=size=%dm:rw", mem)
	if err := r.start("", id, ann, "sleep 100000", "--mount", tmpfs); err != nil {
		return err
	}
	defer r.remove(id)
	fill := mem * 2 / 5
	rnd := min(fill/2, 128)
	if err := r.sh(id, fillScript("/fill/ram", fill, rnd, false)); err != nil {
		return err
	}
	var cs []ckpt
	for i := range r.o.Runs {
		c, err := r.checkpoint(id, r.s.StoreURL(fmt.Sprintf("mem%d:v%d", mem, i)))
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	first := cs[0]
	pause := r.addPause(fmt.Sprintf("pause_guest_%dMiB", mem), cs)
	r.r.add("pause", fmt.Sprintf("pause_guest_%dMiB_ram_allocated", mem), "MiB", mib(r.ramAllocated()))
	r.progress("pause window, %d MiB guest (%d MiB filled, %.0f MiB stored): %.0f ms", mem, fill, mib(first.StoredBytes), Median(pause))
	if !large {
		return nil
	}

	// Incremental: a fresh store, so the first checkpoint uploads all.
	c1, err := r.checkpoint(id, r.s.StoreURL("inc:v1"))
	if err != nil {
		return err
	}
	change := max(1, mem*r.o.ChangePercent/100)
	if err := r.sh(id, fmt.Sprintf("dd if=/dev/urandom of=/fill/ram.rnd bs=1M count=%d conv=notrunc 2>/dev/null", change)); err != nil {
		return err
	}
	r.large, r.delta = r.s.StoreURL("inc:v1"), r.s.StoreURL("inc:v2")
	c2, err := r.checkpoint(id, r.delta)
	if err != nil {
		return err
	}
	r.r.add("incremental", "first_checkpoint_uploaded", "MiB", mib(c1.UploadedBytes))
	r.r.add("incremental", "second_checkpoint_uploaded", "MiB", mib(c2.UploadedBytes))
	// The changed bytes are random: no upload can be smaller than them.
	r.r.add("incremental", "ram_changed", "MiB", float64(change))
	r.r.add("incremental", "second_uploaded_per_changed_byte", "ratio", mib(c2.UploadedBytes)/float64(change))
	r.r.add("incremental", "second_chunks_uploaded", "count", float64(c2.ChunksUploaded))
	r.r.add("incremental", "second_delta_chunks", "count", float64(c2.DeltaChunks))
	r.r.add("incremental", "chunks", "count", float64(c2.Chunks))
	r.progress("incremental: first %.1f MiB, after changing %d MiB of RAM %.1f MiB (%d of %d chunks, %d as deltas)",
		mib(c1.UploadedBytes), change, mib(c2.UploadedBytes), c2.ChunksUploaded, c2.Chunks, c2.DeltaChunks)

	// Where the changed pages are: what smaller chunks would upload.
	dir, err := os.MkdirTemp(r.s.Dir, "diff-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d, err := r.diffRAM(r.large, r.delta, dir)
	if err != nil {
		return fmt.Errorf("compare the two snapshots' RAM: %w", err)
	}
	r.r.add("incremental", "ram_pages_changed", "%", 100*float64(d.changedPages)/float64(max(1, d.pages)))
	r.r.add("incremental", "ram_pages_with_data", "%", 100*float64(d.dataPages)/float64(max(1, d.pages)))
	for _, cs := range diffChunkSizes {
		v := d.chunks[cs]
		r.r.add("incremental", fmt.Sprintf("ram_chunks_changed_at_%dKiB", cs>>10), "%", 100*float64(v[0])/float64(max(1, v[1])))
	}
	r.progress("incremental: %.1f%% of RAM pages changed; RAM chunks changed at 64 KiB %.1f%%, 4 MiB %.1f%%",
		100*float64(d.changedPages)/float64(max(1, d.pages)),
		100*float64(d.chunks[64<<10][0])/float64(max(1, d.chunks[64<<10][1])), 100*float64(d.chunks[4<<20][0])/float64(max(1, d.chunks[4<<20][1])))
	return nil
}

func (r *runner) pauseDisk(disk int) error {
	cfg, err := r.cfgWith(fmt.Sprintf("disk%d", disk), func(c *configs.Config) {
		c.Runtime.WritableDiskMiB = disk
		c.Restore.MaxDiskSizeMiB = max(c.Restore.MaxDiskSizeMiB, 2*int64(disk)) // the disk holds the image too
	})
	if err != nil {
		return err
	}
	id := r.id(fmt.Sprintf("disk%d-", disk))
	if err := r.start(cfg, id, nil, "sleep 100000"); err != nil {
		return err
	}
	defer r.remove(id)
	fill := max(1, disk/8)
	if err := r.sh(id, fillScript("/data/fill", fill, min(fill/2, 64), true)); err != nil {
		return err
	}
	// Two disks are compared with each other, and one checkpoint is only
	// a few hundred ms: take more samples than elsewhere, so that the
	// ratio of the medians is about the disks, not the noise of one copy.
	var cs []ckpt
	for i := range max(r.o.Runs, 5) {
		c, err := r.checkpoint(id, r.s.StoreURL(fmt.Sprintf("disk%d:v%d", disk, i)))
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	pause := r.addPause(fmt.Sprintf("pause_disk_%dMiB", disk), cs)
	r.r.add("pause", fmt.Sprintf("pause_disk_%dMiB_ram_allocated", disk), "MiB", mib(r.ramAllocated()))
	r.progress("pause window, %d MiB disk (%d MiB filled): %.0f ms", disk, fill, Median(pause))
	return nil
}

// ramAllocated is the allocated size of the running guests' RAM files in
// the stack's memory directory: what a checkpoint copies in its pause
// window.
func (r *runner) ramAllocated() int64 {
	files, _ := filepath.Glob(filepath.Join(r.s.MemoryDir, "cryo-*.ram"))
	var n int64
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "cryo-ckpt-") {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(f, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// addPause adds the pause window rows of some checkpoints and returns the
// pause windows.
func (r *runner) addPause(name string, cs []ckpt) []float64 {
	var pause, freeze, ram []float64
	for _, c := range cs {
		pause = append(pause, float64(c.PauseWindowMS))
		if c.freezeMS > 0 {
			freeze, ram = append(freeze, c.freezeMS), append(ram, c.ramMS)
		}
	}
	r.r.add("pause", name, "ms", pause...)
	if len(freeze) > 0 {
		r.r.add("pause", name+"/stop_freeze_devstate", "ms", freeze...)
		r.r.add("pause", name+"/ram_copy_cont", "ms", ram...)
	}
	return pause
}
