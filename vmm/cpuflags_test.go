package vmm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/vmm/qmp"
	"github.com/cryo-runtime/cryo/vmm/qmp/qmptest"
)

const cpuinfo = `processor	: 0
vendor_id	: GenuineIntel
flags		: fpu sse2 sse4_2 pclmulqdq tsc_deadline_timer lahf_lm pni avx2 fpu
bugs		: spectre_v1

processor	: 1
flags		: fpu
`

func fakeCPUInfo(t *testing.T, content string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cpuinfo")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	old := cpuinfoPath
	cpuinfoPath = p
	t.Cleanup(func() { cpuinfoPath = old })
}

func TestHostCPUFlags(t *testing.T) {
	fakeCPUInfo(t, cpuinfo)
	got, err := HostCPUFlags()
	want := []string{"avx2", "fpu", "lahf_lm", "pclmulqdq", "pni", "sse2", "sse4_2", "tsc_deadline_timer"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("HostCPUFlags = %q, %v; want %q", got, err, want)
	}
	fakeCPUInfo(t, "processor : 0\n")
	if _, err := HostCPUFlags(); err == nil {
		t.Error("cpuinfo without flags accepted")
	}
}

func TestModelFlagsNeedsOnlyHostFeatures(t *testing.T) {
	host := []string{"avx2", "fpu", "lahf_lm", "pclmulqdq", "pni", "sse2", "sse4_2", "tsc_deadline_timer"}
	props := map[string]any{
		"pclmulqdq": true, "sse4.2": true, "lahf-lm": true, "sse3": true, "tsc-deadline": true,
		"avx2":       false, // not in the model
		"hypervisor": true,  // not a host feature
		"x2apic":     true,  // emulated: not on this host
		"fpu":        true, "model-id": "Intel Xeon", "family": 6.0,
	}
	got := modelFlags(props, host)
	want := []string{"fpu", "lahf_lm", "pclmulqdq", "pni", "sse4_2", "tsc_deadline_timer"}
	if !slices.Equal(got, want) {
		t.Errorf("modelFlags = %q, want %q", got, want)
	}
}

func TestCPUModelFlagsUnderKVM(t *testing.T) {
	fakeCPUInfo(t, cpuinfo)
	var asked map[string]any
	cfg := unitConfig(t)
	cfg.Accel, cfg.CPUModel = "kvm", "Westmere-v2"
	m, srv := fakeMachine(t, cfg, func(r qmptest.Request) (any, *qmp.Error) {
		asked = args(t, r)
		return map[string]any{"model": map[string]any{"name": "Westmere-v2", "props": map[string]any{"pclmulqdq": true, "sse2": true, "avx2": false}}}, nil
	})
	got, err := m.cpuModelFlags(context.Background())
	if err != nil || !slices.Equal(got, []string{"pclmulqdq", "sse2"}) {
		t.Fatalf("cpuModelFlags = %q, %v", got, err)
	}
	model, _ := asked["model"].(map[string]any)
	if cmds := srv.Commands(); len(cmds) != 1 || cmds[0] != "query-cpu-model-expansion" || asked["type"] != "full" || model["name"] != "Westmere-v2" {
		t.Errorf("asked %v %v", cmds, asked)
	}

	tcg, tsrv := fakeMachine(t, unitConfig(t), func(qmptest.Request) (any, *qmp.Error) { return nil, nil })
	if got, err := tcg.cpuModelFlags(context.Background()); err != nil || got != nil || len(tsrv.Commands()) != 0 {
		t.Errorf("tcg: %q %v after %v: TCG emulates every feature", got, err, tsrv.Commands())
	}
	m.cpuFlags = got
	if fp := m.Fingerprint(); !slices.Equal(fp.HostCPUFlags, got) || !strings.Contains(strings.Join(m.Args(), " "), "Westmere-v2,enforce") {
		t.Errorf("fingerprint flags %q, args %q", fp.HostCPUFlags, m.Args())
	}
}

// TestCheckRestoreNeedsHostCPUFlags: a KVM snapshot whose CPU model used a
// host feature this host lacks is refused before QEMU starts, naming it; a
// snapshot that needs none does not read the host's flags.
func TestCheckRestoreNeedsHostCPUFlags(t *testing.T) {
	cfg := unitConfig(t)
	cfg.QEMUVersion = "7.2.22"
	m := mustNew(t, cfg)
	saved := m.Fingerprint()
	saved.HostCPUFlags = []string{"pclmulqdq", "sse2"}
	fakeCPUInfo(t, "processor\t: 0\nflags\t\t: fpu sse2\n")
	err := m.CheckRestore(saved)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pclmulqdq") || strings.Contains(err.Error(), "sse2") {
		t.Errorf("restore onto a host without pclmulqdq: %v", err)
	}
	fakeCPUInfo(t, "processor\t: 0\nflags\t\t: fpu pclmulqdq sse2\n")
	if err := m.CheckRestore(saved); err != nil {
		t.Errorf("host with every flag: %v", err)
	}
	saved.HostCPUFlags = nil // TCG snapshots record none
	cpuinfoPath = filepath.Join(t.TempDir(), "missing")
	if err := m.CheckRestore(saved); err != nil {
		t.Errorf("snapshot without cpu flags: %v", err)
	}
}
