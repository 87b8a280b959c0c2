package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/stack"
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

func TestBootedMemoryOption(t *testing.T) {
	for _, tc := range []struct{ in, want, wantErr string }{
		{"", configs.BootedOwned, ""},
		{"owned", configs.BootedOwned, ""},
		{"served", configs.BootedServed, ""},
		{"lazy", "", "booted memory"},
		{"Served", "", "booted memory"},
	} {
		got, err := Options{BootedMemory: tc.in}.bootedMemory()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	// Run refuses it before it starts anything.
	if _, err := Run(t.Context(), Options{Sizes: Quick(), BootedMemory: "lazy"}); err == nil || !strings.Contains(err.Error(), "booted memory") {
		t.Errorf("Run with a bad booted memory: %v", err)
	}
}

// TestBootedMemoryConfig: the node config the stack writes for the bench
// says [memory] booted = "served", and the shim's loader reads it back.
func TestBootedMemoryConfig(t *testing.T) {
	for _, booted := range []string{configs.BootedServed, configs.BootedOwned} {
		c := configs.Default()
		withBootedMemory(booted)(&c)
		p := filepath.Join(t.TempDir(), "cryo.toml")
		if err := (&stack.Stack{}).WriteConfig(p, c); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		got := configs.Default()
		if err := configs.Decode(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Memory.Booted != booted {
			t.Errorf("written config has [memory] booted %q, want %q:\n%s", got.Memory.Booted, booted, b)
		}
	}
}

func TestDirtyLimits(t *testing.T) {
	write := func(dir string, kv map[string]string) {
		for k, v := range kv {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	ratios := t.TempDir()
	write(ratios, map[string]string{"dirty_background_bytes": "0", "dirty_background_ratio": "10", "dirty_bytes": "0", "dirty_ratio": "20"})
	if got, want := dirtyLimits(ratios), "background 10%, throttle 20%"; got != want {
		t.Errorf("ratios: %q, want %q", got, want)
	}
	byteDir := t.TempDir()
	write(byteDir, map[string]string{"dirty_background_bytes": "8589934592", "dirty_background_ratio": "0", "dirty_bytes": "17179869184", "dirty_ratio": "0"})
	if got, want := dirtyLimits(byteDir), "background 8192 MiB, throttle 16384 MiB"; got != want {
		t.Errorf("bytes: %q, want %q", got, want)
	}
	if got := dirtyLimits(t.TempDir()); got != "" {
		t.Errorf("nothing to read: %q", got)
	}
}

func TestWriteTextBootedMemory(t *testing.T) {
	r := &Report{Sizes: Quick(), Host: Host{BootedMemory: "served", DirtyLimits: "background 50%, throttle 80%"}}
	var b bytes.Buffer
	r.WriteText(&b)
	if !strings.Contains(b.String(), "booted sandboxes' RAM: served; node dirty limits: background 50%, throttle 80%") {
		t.Errorf("text report does not say the booted memory:\n%s", b.String())
	}
}
