package vmm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// cpuinfoPath is read for the host's CPU flags (a variable for tests).
var cpuinfoPath = "/proc/cpuinfo"

// HostCPUFlags returns the CPU flags of this host (the first processor's
// "flags" line of /proc/cpuinfo), sorted.
func HostCPUFlags() ([]string, error) {
	f, err := os.Open(cpuinfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseCPUFlags(f)
}

func parseCPUFlags(r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "flags" {
			flags := strings.Fields(v)
			slices.Sort(flags)
			return slices.Compact(flags), nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%s has no flags line", cpuinfoPath)
}

// cpuinfoAliases maps QEMU feature names whose /proc/cpuinfo name is not
// the QEMU name with '-' and '.' as '_'.
var cpuinfoAliases = map[string]string{
	"tsc-deadline": "tsc_deadline_timer",
	"pclmuldq":     "pclmulqdq",
	"sse3":         "pni",
	"ds-cpl":       "ds_cpl",
	"xd":           "nx",
	"i64":          "lm",
	"fxsr-opt":     "fxsr_opt",
	"ffxsr":        "fxsr_opt",
	"lahf-lm":      "lahf_lm",
	"cmp-legacy":   "cmp_legacy",
	"kvmclock":     "",
	"hypervisor":   "",
}

// modelFlags returns the /proc/cpuinfo names of the features a CPU model
// enables (QMP query-cpu-model-expansion's props) that this host lists in
// hostFlags, sorted. A feature the host does not list is emulated (or not
// a host feature at all, like "hypervisor") and is left out: a restore
// needs only what the checkpointing host's CPU itself provided.
func modelFlags(props map[string]any, hostFlags []string) []string {
	var out []string
	for name, v := range props {
		if on, ok := v.(bool); !ok || !on {
			continue
		}
		flag, aliased := cpuinfoAliases[name]
		if !aliased {
			flag = strings.NewReplacer("-", "_", ".", "_").Replace(name)
		}
		if flag != "" && slices.Contains(hostFlags, flag) {
			out = append(out, flag)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cpuModelFlags asks the running QEMU which features its CPU model has and
// keeps those this host's CPU provides. Only KVM passes host features
// through: under TCG QEMU emulates every one, and the list is empty.
func (m *Machine) cpuModelFlags(ctx context.Context) ([]string, error) {
	if m.cfg.Accel != "kvm" {
		return nil, nil
	}
	host, err := HostCPUFlags()
	if err != nil {
		return nil, err
	}
	var exp struct {
		Model struct {
			Props map[string]any `json:"props"`
		} `json:"model"`
	}
	args := map[string]any{"type": "full", "model": map[string]any{"name": m.cfg.CPUModel}}
	if err := m.execute(ctx, "query-cpu-model-expansion", args, &exp); err != nil {
		return nil, fmt.Errorf("cpu model %s: %w", m.cfg.CPUModel, err)
	}
	return modelFlags(exp.Model.Props, host), nil
}
