//go:build integration

package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/bench"
	"github.com/cryo-runtime/cryo/stack"
)

// TestBenchQuick runs `cryoctl bench --quick -o json` through the real
// stack and checks that the report has every row and every target with a
// positive number, and that nothing was left running. No timing is
// asserted: the numbers depend on the machine.
func TestBenchQuick(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the bench starts containerd and QEMU and must run as root")
	}
	bin, err := stack.BinDir("")
	if err != nil {
		t.Fatal(err)
	}
	cryoctl := filepath.Join(bin, "cryoctl")
	if _, err := os.Stat(cryoctl); err != nil {
		t.Fatalf("%s missing: run `make binaries` (or set CRYO_BIN)", cryoctl)
	}
	// What a killed earlier run left is not this run's leak.
	before := benchLeftovers()
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	logPath := filepath.Join(t.TempDir(), "containerd.log")
	cmd := exec.CommandContext(ctx, cryoctl, "bench", "--quick", "-o", "json", "--keep-log", logPath)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 6000 {
			tail = tail[len(tail)-6000:]
		}
		t.Fatalf("cryoctl bench --quick: %v\nstderr:\n%s\nstdout:\n%s\ncontainerd log tail:\n%s", err, errb.String(), out.String(), tail)
	}
	t.Logf("progress:\n%s", errb.String())

	var rep bench.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out.String())
	}
	if !rep.Complete {
		t.Fatalf("report not complete: %s", out.String())
	}
	if rep.Host.CPUs < 1 || rep.Host.QEMU == "" {
		t.Fatalf("host = %+v", rep.Host)
	}
	want := bench.RowNames(bench.Quick())
	for _, name := range want {
		row, ok := rep.Row(name)
		if !ok {
			t.Errorf("row %s missing", name)
			continue
		}
		if !(row.Value > 0) || row.Unit == "" {
			t.Errorf("row %s = %v %q, want a positive number with a unit", name, row.Value, row.Unit)
		}
	}
	if len(rep.Rows) != len(want) {
		var got []string
		for _, r := range rep.Rows {
			got = append(got, r.Name)
		}
		t.Errorf("report has %d rows, want %d:\n%s", len(rep.Rows), len(want), strings.Join(got, "\n"))
	}
	if len(rep.Targets) != 21 {
		t.Errorf("report has %d targets, want 21: %+v", len(rep.Targets), rep.Targets)
	}
	for _, tg := range rep.Targets {
		if !(tg.Value > 0) || tg.Want == "" || tg.Detail == "" {
			t.Errorf("target %+v: want a positive value, the goal and a detail", tg)
		}
	}
	// Everything the bench started is gone.
	for _, l := range benchLeftovers() {
		if !slices.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
}

// benchLeftovers names the bench's QEMU, containerd and shim processes and
// its RAM directories that exist now.
func benchLeftovers() []string {
	var out []string
	for _, p := range stack.ProcsMatching("qemu-system", "/cryo-bench-") {
		out = append(out, fmt.Sprintf("qemu pid %d", p))
	}
	for _, p := range stack.ProcsMatching("containerd", "/cryo-bench-") {
		out = append(out, fmt.Sprintf("containerd or shim pid %d", p))
	}
	dirs, _ := filepath.Glob("/dev/shm/cryo-bench-*")
	for _, d := range dirs {
		out = append(out, "RAM directory "+d)
	}
	return out
}
