package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	in := []float64{3, 1, 2}
	Median(in)
	if in[0] != 3 {
		t.Errorf("Median sorted its argument: %v", in)
	}
}

func TestSizesValidate(t *testing.T) {
	for name, s := range map[string]Sizes{"quick": Quick(), "default": Default(), "full": Full()} {
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := Quick()
	bad.Clones = []int{2, 4}
	if bad.Validate() == nil {
		t.Error("clones not starting with 1 accepted")
	}
	bad = Quick()
	bad.WarmUp = time.Millisecond
	if bad.Validate() == nil {
		t.Error("1ms warm-up accepted")
	}
}

func TestRowNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range RowNames(Full()) {
		if seen[n] {
			t.Errorf("row %s listed twice", n)
		}
		seen[n] = true
	}
	if !seen["fanout_8_last_to_exec"] || !seen["pause_disk_8192MiB"] || !seen["shim_peak_rss_restore_1024MiB"] {
		t.Errorf("full sizes miss rows: %v", RowNames(Full()))
	}
}

func TestWriteText(t *testing.T) {
	r := &Report{Sizes: Quick(), Complete: true}
	r.add("latency", "cold_boot_to_exec", "ms", 3000, 4000, 5000)
	r.add("latency", "restore_to_exec_cached", "ms", 250)
	r.target("restore / cold", "<= 0.10", 0.0625, true, "250 ms vs 4000 ms")
	r.target("pipeline", ">= 0.80", 0.2, false, "slow")
	var b bytes.Buffer
	r.WriteText(&b)
	out := b.String()
	for _, want := range []string{"cold_boot_to_exec", "4000", "3000 4000 5000", "PASS", "MISS", "<= 0.10"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "incomplete") {
		t.Errorf("complete report says incomplete:\n%s", out)
	}
}
