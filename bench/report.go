// Package bench measures cryo on the current machine through the real
// stack (containerd, the shim, QEMU, file and S3 stores): cold boot against
// restore, an expensive warm-up, clone fan-out, checkpoint pause windows,
// the restore pipeline against raw hashing and decompression, incremental
// checkpoints and the shim's memory. `cryoctl bench` prints its Report.
package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one measured quantity: the median of its samples.
type Row struct {
	Group   string    `json:"group"`
	Name    string    `json:"name"`
	Value   float64   `json:"value"`
	Unit    string    `json:"unit"`
	Samples []float64 `json:"samples,omitempty"`
	Note    string    `json:"note,omitempty"`
}

// Target is one of the performance goals, checked on this run's numbers.
type Target struct {
	Name   string  `json:"name"`
	Want   string  `json:"want"`
	Value  float64 `json:"value"`
	Pass   bool    `json:"pass"`
	Detail string  `json:"detail"`
}

// Report is the outcome of Run.
type Report struct {
	Host     Host     `json:"host"`
	Sizes    Sizes    `json:"sizes"`
	Rows     []Row    `json:"rows"`
	Targets  []Target `json:"targets"`
	Seconds  float64  `json:"seconds"`
	Complete bool     `json:"complete"`
	// Only is Options.Only: the run measured only the steps it matches.
	Only string `json:"only,omitempty"`
}

// Host describes the machine the numbers come from.
type Host struct {
	CPUs   int    `json:"cpus"`
	Accel  string `json:"accel"`
	QEMU   string `json:"qemu"`
	Kernel string `json:"kernel"`
	// BootedMemory is the node's [memory] booted: "owned" or "served".
	BootedMemory string `json:"bootedMemory"`
	// DirtyLimits are the node's vm.dirty_* settings at the start: a
	// served RAM is dirty page cache, so they bound its guest's speed.
	DirtyLimits string `json:"dirtyLimits"`
}

// dirtyLimits describes the vm.dirty_* sysctls under dir (/proc/sys/vm):
// each of the background and the throttle limit is a byte count when its
// _bytes file is not 0, else a ratio of dirtyable memory, as the kernel
// reads them. "" when they cannot be read.
func dirtyLimits(dir string) string {
	limit := func(name string) string {
		read := func(f string) string {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return ""
			}
			return strings.TrimSpace(string(b))
		}
		if b := read(name + "_bytes"); b != "" && b != "0" {
			if n, err := strconv.ParseInt(b, 10, 64); err == nil {
				return fmt.Sprintf("%.0f MiB", mib(n))
			}
		}
		if r := read(name + "_ratio"); r != "" {
			return r + "%"
		}
		return "?"
	}
	bg, th := limit("dirty_background"), limit("dirty")
	if bg == "?" && th == "?" {
		return ""
	}
	return "background " + bg + ", throttle " + th
}

// Median returns the median of v (0 for none).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *Report) add(group, name, unit string, samples ...float64) Row {
	row := Row{Group: group, Name: name, Unit: unit, Value: Median(samples)}
	if len(samples) > 1 {
		row.Samples = samples
	}
	r.Rows = append(r.Rows, row)
	return row
}

// Row returns the row called name.
func (r *Report) Row(name string) (Row, bool) {
	for _, x := range r.Rows {
		if x.Name == name {
			return x, true
		}
	}
	return Row{}, false
}

func (r *Report) value(name string) float64 {
	x, _ := r.Row(name)
	return x.Value
}

func (r *Report) target(name, want string, value float64, pass bool, detail string) {
	r.Targets = append(r.Targets, Target{Name: name, Want: want, Value: value, Pass: pass, Detail: detail})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// WriteText prints the rows grouped, then the targets with PASS/MISS.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "cryo bench: %d CPUs, accel %s, QEMU %s, %d run(s) per median, %.0f s\n\n",
		r.Host.CPUs, r.Host.Accel, r.Host.QEMU, r.Sizes.Runs, r.Seconds)
	if r.Host.BootedMemory != "" {
		fmt.Fprintf(w, "booted sandboxes' RAM: %s; node dirty limits: %s\n\n", r.Host.BootedMemory, r.Host.DirtyLimits)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tMEASUREMENT\tMEDIAN\tUNIT\tSAMPLES")
	last := ""
	for _, x := range r.Rows {
		g := x.Group
		if g == last {
			g = ""
		}
		last = x.Group
		var ss []string
		for _, s := range x.Samples {
			ss = append(ss, trim(s))
		}
		note := strings.Join(ss, " ")
		if x.Note != "" {
			note = strings.TrimSpace(note + "  " + x.Note)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", g, x.Name, trim(x.Value), x.Unit, note)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tWANT\tGOT\tRESULT\tDETAIL")
	for _, t := range r.Targets {
		res := "MISS"
		if t.Pass {
			res = "PASS"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Want, trim(t.Value), res, t.Detail)
	}
	tw.Flush()
	switch {
	case r.Only != "":
		fmt.Fprintf(w, "\n(only the steps matching %q)\n", r.Only)
	case !r.Complete:
		fmt.Fprintln(w, "\n(incomplete: the bench stopped early; see the error)")
	}
}

func trim(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1 || v <= -1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// RowNames lists the rows a complete Run with sizes s reports, in order.
func RowNames(s Sizes) []string {
	timings := func(n string) []string { return []string{n, n + "/ctr_run", n + "/first_exec", n + "/second_exec"} }
	var n []string
	n = append(n, timings("cold_boot_to_exec")...)
	n = append(n, "template_snapshot_stored")
	for _, x := range []string{"restore_to_exec_cached", "restore_to_exec_file", "restore_to_exec_s3"} {
		n = append(n, timings(x)...)
	}
	n = append(n, "warmup_cold_to_answer", "warmup_restore_to_answer")
	for _, c := range s.Clones {
		p := fmt.Sprintf("fanout_%d_", c)
		n = append(n, p+"last_to_exec", p+"downloaded", p+"materializations", p+"qemu_pss_total", p+"qemu_rss_total", p+"cpu_total", p+"cpu_qemu")
	}
	pause := func(name string) []string {
		return []string{name, name + "/stop_freeze_devstate", name + "/ram_copy_cont", name + "_ram_allocated"}
	}
	n = append(n, pause(fmt.Sprintf("pause_guest_%dMiB", s.SmallGuestMiB))...)
	n = append(n, pause(fmt.Sprintf("pause_guest_%dMiB", s.LargeGuestMiB))...)
	n = append(n, "first_checkpoint_uploaded", "second_checkpoint_uploaded", "ram_changed", "second_uploaded_per_changed_byte", "second_chunks_uploaded", "second_delta_chunks", "chunks",
		"ram_pages_changed", "ram_pages_with_data")
	for _, cs := range diffChunkSizes {
		n = append(n, fmt.Sprintf("ram_chunks_changed_at_%dKiB", cs>>10))
	}
	n = append(n, pause(fmt.Sprintf("pause_disk_%dMiB", s.SmallDiskMiB))...)
	n = append(n, pause(fmt.Sprintf("pause_disk_%dMiB", s.LargeDiskMiB))...)
	n = append(n, "snapshot_raw_nonzero", "raw_sha256", "raw_zstd_decode", "raw_write", "fetch_verify_materialize",
		"materialize_from_node_cache", "fetch_verify_materialize_tmpfs",
		fmt.Sprintf("shim_peak_rss_restore_%dMiB", s.LargeGuestMiB), fmt.Sprintf("qemu_rss_after_restore_%dMiB", s.LargeGuestMiB))
	n = append(n, "large_snapshot_stored", "large_snapshot_ram")
	for _, size := range []string{"small", "large"} {
		for _, mode := range []string{"eager", "lazy"} {
			x := fmt.Sprintf("s3_1gbit_%s_%s_to_exec", size, mode)
			n = append(n, timings(x)...)
			n = append(n, x+"/fetched", x+"/fetched_of_stored")
		}
	}
	n = append(n, timings("cached_large_lazy_to_exec")...)
	c := s.Clones[len(s.Clones)-1]
	n = append(n, "floor_large_to_first_command", fmt.Sprintf("clones_%d_last_to_exec", c), fmt.Sprintf("clones_%d_fetched_of_stored", c), fmt.Sprintf("clones_%d_qemu_pss_total", c))
	n = append(n, "booted_pause", "booted_uploaded")
	for g := 1; g <= hibernateGens; g++ {
		p := fmt.Sprintf("gen%d_", g)
		n = append(n, p+"restore_to_exec", p+"pause", p+"uploaded", p+"uploaded_per_changed_byte", p+"delta_chunks", p+"ram_dirty", p+"uploaded_per_dirty_byte")
	}
	return append(n, pauseRAMRowNames(s)...)
}
