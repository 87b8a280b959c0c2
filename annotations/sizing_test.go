package annotations

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
)

func sizingConfig() configs.Config {
	cfg := configs.Default()
	cfg.Hypervisor.VCPUs, cfg.Hypervisor.MemoryMiB = 1, 512
	cfg.Hypervisor.MaxVCPUs, cfg.Hypervisor.MaxMemoryMiB = 4, 4096
	return cfg
}

func TestPodSize(t *testing.T) {
	cfg := sizingConfig()
	lim := func(quota, period, mem string) map[string]string {
		return map[string]string{SandboxCPUQuota: quota, SandboxCPUPeriod: period, SandboxMemory: mem}
	}
	for _, tc := range []struct {
		name          string
		in            map[string]string
		vcpus, memory int
		wantErr, key  string
	}{
		{name: "no annotations", in: nil, vcpus: 1, memory: 512},
		{name: "no limits (kubelet sends zeros)", in: lim("0", "100000", "0"), vcpus: 1, memory: 512},
		{name: "unlimited quota", in: lim("-1", "100000", "0"), vcpus: 1, memory: 512},
		{name: "one cpu, 256Mi", in: lim("100000", "100000", "268435456"), vcpus: 2, memory: 768},
		{name: "fraction rounds up", in: lim("150000", "100000", "1"), vcpus: 3, memory: 513},
		{name: "small fraction", in: lim("10000", "100000", "0"), vcpus: 2, memory: 512},
		{name: "no period means 100ms", in: lim("200000", "", ""), vcpus: 3, memory: 512},
		{name: "at the maximum", in: lim("300000", "100000", "3758096384"), vcpus: 4, memory: 4096},
		{name: "cryo annotations win", in: map[string]string{
			SandboxCPUQuota: "300000", SandboxCPUPeriod: "100000", SandboxMemory: "1073741824", VCPUs: "1", Memory: "256Mi"},
			vcpus: 1, memory: 256},
		{name: "cryo annotation wins over a limit above the max", in: map[string]string{SandboxMemory: "68719476736", Memory: "1Gi"},
			vcpus: 1, memory: 1024},
		{name: "cryo vcpus, memory from the limit", in: map[string]string{VCPUs: "2", SandboxMemory: "536870912"}, vcpus: 2, memory: 1024},
		{name: "cpu limit above the max", in: lim("400000", "100000", "0"), key: SandboxCPUQuota, wantErr: "more than max_vcpus 4"},
		{name: "memory limit above the max", in: lim("0", "0", "4294967296"), key: SandboxMemory, wantErr: "more than max_memory 4096"},
		{name: "huge memory limit", in: lim("0", "0", "9007199254740992"), key: SandboxMemory, wantErr: "more than max_memory"},
		{name: "memory beyond 2^53", in: lim("0", "0", "9223372036854775807"), key: SandboxMemory, wantErr: "whole number"},
		{name: "quota not a number", in: lim("lots", "100000", "0"), key: SandboxCPUQuota, wantErr: "whole number"},
		{name: "period too small", in: lim("100000", "10", "0"), key: SandboxCPUPeriod, wantErr: "between 1000"},
		{name: "period negative", in: lim("100000", "-5", "0"), key: SandboxCPUPeriod, wantErr: "between 1000"},
		{name: "memory not a number", in: lim("0", "0", "1Gi"), key: SandboxMemory, wantErr: "whole number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(tc.in, cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.key) ||
					!errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("error = %v, want %q naming %s (invalid argument)", err, tc.wantErr, tc.key)
				}
				return
			}
			if err != nil || r.VCPUs != tc.vcpus || r.MemoryMiB != tc.memory {
				t.Fatalf("Parse = %d vCPUs, %d MiB, %v; want %d, %d", r.VCPUs, r.MemoryMiB, err, tc.vcpus, tc.memory)
			}
		})
	}
}

func TestCheckRestoredSize(t *testing.T) {
	cfg := sizingConfig()
	for _, tc := range []struct {
		name          string
		in            map[string]string
		vcpus, memory int
		wantErr       string
	}{
		{name: "pod asks nothing: any size within the max", vcpus: 3, memory: 2048},
		{name: "same size by limits", in: map[string]string{SandboxCPUQuota: "100000", SandboxMemory: "268435456"}, vcpus: 2, memory: 768},
		{name: "same size by cryo annotations", in: map[string]string{VCPUs: "2", Memory: "1Gi"}, vcpus: 2, memory: 1024},
		{name: "only memory asked", in: map[string]string{SandboxMemory: "268435456"}, vcpus: 4, memory: 768},
		{name: "limits ask for more memory", in: map[string]string{SandboxMemory: "1073741824"}, vcpus: 1, memory: 768,
			wantErr: "asks for 1536 MiB of memory (its limits, " + SandboxMemory},
		{name: "cryo annotation asks for fewer vcpus", in: map[string]string{VCPUs: "1"}, vcpus: 2, memory: 512,
			wantErr: "asks for 1 vCPUs (" + VCPUs + "=1)"},
		{name: "snapshot above the node max", vcpus: 8, memory: 512, wantErr: "bigger than this node's max_vcpus 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRestoredSize(tc.in, cfg, tc.vcpus, tc.memory)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("error = %v, want %q (failed precondition)", err, tc.wantErr)
			}
		})
	}
}
