package annotations

import (
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
)

// Keys containerd's CRI plugin sets on a pod sandbox's spec from the
// kubelet's LinuxPodSandboxConfig.Resources: the sum of the pod's container
// limits (containerd internal/cri/annotations). A pod without limits gets 0.
const (
	SandboxCPUPeriod = "io.kubernetes.cri.sandbox-cpu-period"
	SandboxCPUQuota  = "io.kubernetes.cri.sandbox-cpu-quota"
	SandboxMemory    = "io.kubernetes.cri.sandbox-memory"
)

// defaultCPUPeriod is the kernel's CFS period, which the kubelet uses when
// the pod gives none.
const defaultCPUPeriod = 100_000

// withPodSize sizes the VM from the pod's limits, as Kata does: the node's
// default size (the guest kernel and agent's share) plus the pod's CPU and
// memory limits. cryo.dev/vcpus and cryo.dev/memory, already in r, give the
// whole size and win. A pod whose limits do not fit under the node's
// max_vcpus/max_memory is refused rather than run in a smaller VM: its
// workload would be starved or OOM-killed below the limit it was promised,
// with nothing in its events saying why.
func withPodSize(r Request, a map[string]string, cfg configs.Config) (Request, error) {
	h := cfg.Hypervisor
	if _, set := a[VCPUs]; !set {
		n, err := podVCPUs(a)
		if err != nil {
			return r, err
		}
		if int64(h.VCPUs)+n > int64(h.MaxVCPUs) {
			return r, invalid(SandboxCPUQuota, a[SandboxCPUQuota], fmt.Sprintf(
				"the pod's cpu limit (%d vCPUs) plus the node's default_vcpus %d is more than max_vcpus %d; lower the limit or set %s",
				n, h.VCPUs, h.MaxVCPUs, VCPUs))
		}
		r.VCPUs = h.VCPUs + int(n)
	}
	if _, set := a[Memory]; !set {
		mib, err := podMemoryMiB(a)
		if err != nil {
			return r, err
		}
		if int64(h.MemoryMiB)+mib > int64(h.MaxMemoryMiB) {
			return r, invalid(SandboxMemory, a[SandboxMemory], fmt.Sprintf(
				"the pod's memory limit (%d MiB) plus the node's default_memory %d MiB is more than max_memory %d MiB; lower the limit or set %s",
				mib, h.MemoryMiB, h.MaxMemoryMiB, Memory))
		}
		r.MemoryMiB = h.MemoryMiB + int(mib)
	}
	return r, nil
}

// podVCPUs is the pod's CPU limit in whole vCPUs, rounded up; 0 without a
// limit (quota absent, 0 or -1).
func podVCPUs(a map[string]string) (int64, error) {
	quota, err := int64Annotation(a, SandboxCPUQuota)
	if err != nil || quota <= 0 {
		return 0, err
	}
	period, err := int64Annotation(a, SandboxCPUPeriod)
	if err != nil {
		return 0, err
	}
	if period == 0 {
		period = defaultCPUPeriod
	}
	// The kernel's bounds for cpu.cfs_period_us: 1 ms to 1 s.
	if period < 1000 || period > 1_000_000 {
		return 0, invalid(SandboxCPUPeriod, a[SandboxCPUPeriod], "must be between 1000 and 1000000 µs")
	}
	return (quota + period - 1) / period, nil
}

// podMemoryMiB is the pod's memory limit in MiB, rounded up; 0 without one.
func podMemoryMiB(a map[string]string) (int64, error) {
	b, err := int64Annotation(a, SandboxMemory)
	if err != nil || b <= 0 {
		return 0, err
	}
	return (b + 1<<20 - 1) >> 20, nil
}

func int64Annotation(a map[string]string, k string) (int64, error) {
	v, ok := a[k]
	if !ok || v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > 1<<53 {
		return 0, invalid(k, v, "not a whole number below 2^53")
	}
	return n, nil
}

// CheckRestoredSize decides whether a pod may take over a snapshot's VM of
// vcpus and memoryMiB: a restored VM keeps its size (its RAM and device
// state are that size). A snapshot bigger than the node's maximum is
// refused, as is one that differs in a dimension the pod asks for (by a
// cryo.dev size annotation or a pod limit): the pod would run with more or
// less than its spec says and the node accounts for. A dimension the pod
// leaves open takes the snapshot's value. The error is
// errdefs.ErrFailedPrecondition; under restore-fallback cold the pod then
// boots cold at its own size.
func CheckRestoredSize(a map[string]string, cfg configs.Config, vcpus, memoryMiB int) error {
	h := cfg.Hypervisor
	if vcpus > h.MaxVCPUs || memoryMiB > h.MaxMemoryMiB {
		return fmt.Errorf("the snapshot's vm (%d vCPUs, %d MiB) is bigger than this node's max_vcpus %d / max_memory %d MiB: %w",
			vcpus, memoryMiB, h.MaxVCPUs, h.MaxMemoryMiB, errdefs.ErrFailedPrecondition)
	}
	want, err := Parse(a, cfg)
	if err != nil {
		return err
	}
	askCPU, askMem := podAsksSize(a)
	if askCPU && want.VCPUs != vcpus {
		return fmt.Errorf("the pod asks for %d vCPUs (%s), the snapshot's vm has %d: %w",
			want.VCPUs, sizeSource(a, VCPUs, SandboxCPUQuota), vcpus, errdefs.ErrFailedPrecondition)
	}
	if askMem && want.MemoryMiB != memoryMiB {
		return fmt.Errorf("the pod asks for %d MiB of memory (%s), the snapshot's vm has %d MiB: %w",
			want.MemoryMiB, sizeSource(a, Memory, SandboxMemory), memoryMiB, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// podAsksSize says which dimensions of the VM the pod's annotations set.
func podAsksSize(a map[string]string) (cpu, memory bool) {
	_, cpu = a[VCPUs]
	_, memory = a[Memory]
	if n, _ := podVCPUs(a); n > 0 {
		cpu = true
	}
	if n, _ := podMemoryMiB(a); n > 0 {
		memory = true
	}
	return cpu, memory
}

func sizeSource(a map[string]string, cryoKey, podKey string) string {
	if v, ok := a[cryoKey]; ok {
		return cryoKey + "=" + v
	}
	return "its limits, " + podKey + "=" + a[podKey]
}
