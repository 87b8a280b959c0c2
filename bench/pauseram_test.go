package bench

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMemWrite: the writer writes every page of its RAM each sweep and its
// last report counts them all.
func TestMemWrite(t *testing.T) {
	var out bytes.Buffer
	if err := memWrite(2, 3, &out); err != nil {
		t.Fatal(err)
	}
	s, err := parseMemw(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if s.sweeps != 3 || s.written != 3*2<<20 {
		t.Errorf("last report %+v, want 3 sweeps and %d bytes\n%s", s, 3*2<<20, out.String())
	}
	if code := MemWriter([]string{"0"}, &out, &out); code != 2 {
		t.Errorf("MemWriter 0 MiB: exit %d, want 2", code)
	}
}

func TestParseMemw(t *testing.T) {
	for _, tc := range []struct {
		in      string
		sweeps  int64
		written int64
		bad     bool
	}{
		{in: "W 0 4096 E\nW 1 8192 E\n", sweeps: 1, written: 8192},
		// tail read the last line while it was being written
		{in: "W 2 8192 E\nW 3 12288 E\nW 3 163", sweeps: 3, written: 12288},
		{in: "W 2 8192 E\nW 3 16384\n", sweeps: 2, written: 8192},
		{in: "goroutine 1 [running]:\n", bad: true},
		{in: "W -1 5 E\n", bad: true},
		{in: "", bad: true},
	} {
		s, err := parseMemw(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseMemw(%q) = %+v, want an error", tc.in, s)
			}
			continue
		}
		if err != nil || s.sweeps != tc.sweeps || s.written != tc.written {
			t.Errorf("parseMemw(%q) = %+v, %v; want %d sweeps, %d bytes", tc.in, s, err, tc.sweeps, tc.written)
		}
	}
}

func TestWriteRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := memwSample{at: t0, written: 100 << 20}
	b := memwSample{at: t0.Add(2 * time.Second), written: 500 << 20}
	if got := writeRate(a, b); got != 200 {
		t.Errorf("400 MiB in 2 s = %v MiB/s, want 200", got)
	}
	if got := writeRate(b, a); got != 0 {
		t.Errorf("samples out of order: %v, want 0", got)
	}
}

// TestPauseRAMRows: the rows name each size and kind, the ratio of the
// largest to the smallest, and the clones; the full run has the 4 GiB
// rows, the quick one does not.
func TestPauseRAMRows(t *testing.T) {
	full := RowNames(Full())
	for _, want := range []string{"pause_booted_4096MiB_in_use", "pause_restored_256MiB_in_use", "pause_booted_4096MiB_over_256MiB",
		"pause_restored_4096MiB_over_256MiB", "memwrite_booted_4096MiB_checkpoint_over_idle", "memwrite_restored_256MiB_idle",
		"lazy_clones_1_qemu_pss_total", "lazy_clones_8_qemu_pss_total", "lazy_clones_8_over_1_qemu_pss",
		"lazy_warm_clones_1_qemu_pss_total", "lazy_warm_clones_4_qemu_pss_total", "lazy_warm_clones_4_over_1_qemu_pss",
		"lazy_warm_clones_1_guest_ram_pss_total", "lazy_warm_clones_4_guest_ram_pss_total", "lazy_warm_clones_4_over_1_guest_ram_pss",
		"lazy_warm_first_read_512MiB"} {
		if !slices.Contains(full, want) {
			t.Errorf("full rows lack %s", want)
		}
	}
	quick := RowNames(Quick())
	if slices.Contains(quick, "pause_booted_4096MiB_in_use") || !slices.Contains(quick, "pause_booted_1024MiB_over_256MiB") ||
		!slices.Contains(quick, "lazy_warm_clones_2_over_1_qemu_pss") || !slices.Contains(quick, "lazy_warm_first_read_128MiB") {
		t.Errorf("quick rows: %v", pauseRAMRowNames(Quick()))
	}
	for what, change := range map[string]func(*Sizes){
		"descending pause sizes": func(s *Sizes) { s.PauseRAMMiB = []int{1024, 256} },
		"one pause size":         func(s *Sizes) { s.PauseRAMMiB = []int{256} },
		"one Pss clone":          func(s *Sizes) { s.PssClones = 1 },
		"one warm clone":         func(s *Sizes) { s.WarmClones = 1 },
		"an empty warm fill":     func(s *Sizes) { s.WarmFillMiB = 0 },
	} {
		bad := Quick()
		change(&bad)
		if bad.Validate() == nil {
			t.Errorf("%s accepted", what)
		}
	}
	// The full run's warm clones fit the bench machine: their fills
	// together at most 4 GiB (each clone holds its own today).
	for name, s := range map[string]Sizes{"quick": Quick(), "default": Default(), "full": Full()} {
		if s.WarmClones*s.WarmFillMiB > 4096 {
			t.Errorf("%s: %d warm clones of %d MiB", name, s.WarmClones, s.WarmFillMiB)
		}
	}
}

// TestCheckFillRead: a clone's read of its fill counts, and a missing or
// short fill (a clone that restored another guest) fails the row.
func TestCheckFillRead(t *testing.T) {
	for _, tc := range []struct {
		out string
		ok  bool
	}{
		{"536870912\n", true},
		{"  300000000\n", true},
		{"1048576\n", false},
		{"0\n", false},
		{"cat: can't open '/fill/ram.rnd': No such file or directory\n0\n", false},
		{"", false},
	} {
		if err := checkFillRead(tc.out, 512); (err == nil) != tc.ok {
			t.Errorf("checkFillRead(%q, 512) = %v, want ok %v", tc.out, err, tc.ok)
		}
	}
}

// TestPauseRAMTargets: the targets read the rows, fail a pause that grows
// with RAM, a writer slowed by a checkpoint and clones that share nothing.
func TestPauseRAMTargets(t *testing.T) {
	run := func(pause256, pause4G, during, pss8, shared float64) []bool {
		s := Full()
		r := &runner{r: &Report{}, o: Options{Sizes: s}}
		for _, kind := range []string{kindBooted, kindRestored} {
			for _, inUse := range s.PauseRAMMiB {
				in, dn, rn := memwRows(kind, inUse)
				p := pause256
				if inUse == 4096 {
					p = pause4G
				}
				r.r.add("pause_ram", pauseRow(kind, inUse), "ms", p)
				r.r.add("pause_ram", in, "MiB/s", 1000)
				r.r.add("pause_ram", dn, "MiB/s", during)
				r.r.add("pause_ram", rn, "ratio", during/1000)
			}
			r.r.add("pause_ram", pauseRatioRow(kind, 256, 4096), "ratio", pause4G/pause256)
		}
		r.r.add("pause_ram", "lazy_clones_1_qemu_pss_total", "MiB", 100)
		r.r.add("pause_ram", "lazy_clones_8_qemu_pss_total", "MiB", pss8)
		r.r.add("pause_ram", "lazy_clones_8_over_1_qemu_pss", "ratio", pss8/100)
		for _, c := range []struct {
			rows cloneRows
			n    int
		}{{sharedIdleClones, s.PssClones}, {sharedWarmClones, s.WarmClones}} {
			r.r.add("pause_ram", c.rows.pss(1), "MiB", 100)
			r.r.add("pause_ram", c.rows.pss(c.n), "MiB", shared)
			r.r.add("pause_ram", c.rows.ratio(c.n), "ratio", shared/100)
		}
		r.pauseRAMTargets()
		var out []bool
		for _, x := range r.r.Targets {
			out = append(out, x.Pass)
			if x.Detail == "" || x.Want == "" {
				t.Errorf("target %+v lacks a detail", x)
			}
		}
		return out
	}
	if got := fmt.Sprint(run(20, 22, 950, 180, 150)); got != "[true true true true true true true]" {
		t.Errorf("all within the targets: %v", got)
	}
	if got := fmt.Sprint(run(200, 2000, 500, 800, 500)); got != "[false false false false false false false]" {
		t.Errorf("today's shape: %v", got)
	}
	// Shared clones within the target, lazy ones not.
	if got := fmt.Sprint(run(20, 22, 950, 800, 150)); got != "[true true true true false true true]" {
		t.Errorf("shared clones within: %v", got)
	}
	// within 1.2x but over 30 ms misses too
	if got := run(32, 35, 950, 180, 150); got[0] || got[1] {
		t.Errorf("a 35 ms pause passed: %v", got)
	}
	if !strings.Contains(pauseRatioRow(kindBooted, 256, 4096), "4096MiB_over_256MiB") {
		t.Error(pauseRatioRow(kindBooted, 256, 4096))
	}
}

// TestTargetsCount: a complete run checks every target, issue 21's
// among them (TestBenchQuick counts them on a real run).
func TestTargetsCount(t *testing.T) {
	r := &runner{r: &Report{}, o: Options{Sizes: Quick()}}
	r.targets()
	if len(r.r.Targets) != 21 {
		t.Errorf("%d targets, want 21", len(r.r.Targets))
	}
}
