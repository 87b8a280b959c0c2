package fingerprint

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheck(t *testing.T) {
	base := Fingerprint{QEMUVersion: "7.2.0", MachineType: "pc-q35-7.2", CPUModel: "qemu64",
		HostCPUFlags: []string{"sse2", "avx"}, MemoryMiB: 512, VCPUs: 2,
		Devices:      []Device{{ID: "blk0", Driver: "virtio-blk-pci", PCIAddr: "0x4"}, {ID: "net0", Driver: "virtio-net-pci", PCIAddr: "0x5"}},
		KernelDigest: "sha256:aa", InitrdDigest: "sha256:bb", Accel: "tcg"}
	host := base
	host.HostCPUFlags = []string{"avx", "sse2", "avx2"}       // more flags is fine
	host.Devices = []Device{base.Devices[1], base.Devices[0]} // order is not
	if err := base.Check(host); err != nil {
		t.Fatalf("same VM: %v", err)
	}
	cases := []struct {
		field string
		edit  func(f *Fingerprint)
	}{
		{"QEMUVersion", func(f *Fingerprint) { f.QEMUVersion = "7.1.0" }}, // older than pc-q35-7.2
		{"MachineType", func(f *Fingerprint) { f.MachineType = "pc-q35-8.0" }},
		{"CPUModel", func(f *Fingerprint) { f.CPUModel = "host" }},
		{"MemoryMiB", func(f *Fingerprint) { f.MemoryMiB = 1024 }},
		{"VCPUs", func(f *Fingerprint) { f.VCPUs = 1 }},
		{"KernelDigest", func(f *Fingerprint) { f.KernelDigest = "sha256:cc" }},
		{"InitrdDigest", func(f *Fingerprint) { f.InitrdDigest = "sha256:cc" }},
		{"Accel", func(f *Fingerprint) { f.Accel = "kvm" }},
		{"HostCPUFlags", func(f *Fingerprint) { f.HostCPUFlags = []string{"sse2"} }},
		{"Devices[blk0]", func(f *Fingerprint) {
			f.Devices = []Device{{ID: "blk0", Driver: "virtio-blk-pci", PCIAddr: "0x6"}, base.Devices[1]}
		}},
		{"Devices[net0]", func(f *Fingerprint) { f.Devices = []Device{base.Devices[0]} }},
		{"Devices[extra]", func(f *Fingerprint) {
			f.Devices = append(append([]Device{}, base.Devices...), Device{ID: "extra", Driver: "e1000"})
		}},
	}
	for _, tc := range cases {
		h := host
		tc.edit(&h)
		err := base.Check(h)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v", tc.field, err)
		}
	}
}

// TestQEMUVersionRule: with a versioned machine type the QEMU versions may
// differ both ways, as long as the host's QEMU knows the machine type; with
// an alias they must agree on major.minor.
func TestQEMUVersionRule(t *testing.T) {
	for _, tc := range []struct {
		machine, saved, host string
		ok                   bool
	}{
		{"pc-q35-7.2", "7.2.19", "7.2.22", true},
		{"pc-q35-7.2", "7.2.19", "8.2.2", true},  // older to newer
		{"pc-q35-7.2", "8.2.2", "7.2.19", true},  // newer to older, same machine type
		{"pc-q35-7.2", "7.2.19", "7.1.0", false}, // does not know pc-q35-7.2
		{"pc-q35-7.2", "7.2.19", "", false},      // unknown
		{"q35", "7.2.19", "7.2.22", true},
		{"q35", "7.2.19", "8.0.0", false},
	} {
		saved := Fingerprint{QEMUVersion: tc.saved, MachineType: tc.machine}
		host := Fingerprint{QEMUVersion: tc.host, MachineType: tc.machine}
		err := saved.Check(host)
		if tc.ok != (err == nil) || err != nil && (!errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "QEMUVersion")) {
			t.Errorf("%s: saved by %s, host %s: %v", tc.machine, tc.saved, tc.host, err)
		}
	}
}

// TestCheckNamesEveryDifference: one refusal names all of them.
func TestCheckNamesEveryDifference(t *testing.T) {
	saved := Fingerprint{QEMUVersion: "7.2.19", MachineType: "pc-q35-7.2", CPUModel: "qemu64", MemoryMiB: 256}
	host := saved
	host.CPUModel, host.MemoryMiB = "max", 512
	err := saved.Check(host)
	for _, want := range []string{"CPUModel: snapshot qemu64, host max", "MemoryMiB: snapshot 256, host 512"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}
