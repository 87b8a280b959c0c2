package shim

import (
	"encoding/json"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/vmm"
)

// sandboxRecord is the "spec" file of a snapshot: what a restore needs to
// rebuild the VM exactly (device layout, sizes) and to map new containers
// onto the guest's. It is stored encrypted along with the chunks.
type sandboxRecord struct {
	Version     int    `json:"version"`
	SandboxID   string `json:"sandboxID"`
	VCPUs       int    `json:"vcpus"`
	MemoryMiB   int    `json:"memoryMiB"`
	HotplugPort int    `json:"hotplugPorts"`
	// RAMInStream is set when the guest RAM travels in the device-state
	// stream instead of a "ram" file: the checkpointed VM was itself
	// restored, and its RAM was a private mapping that x-ignore-shared does
	// not skip.
	RAMInStream bool            `json:"ramInStream,omitempty"`
	Fingerprint vmm.Fingerprint `json:"fingerprint"`
	// NICMAC is the MAC of the guest's pod NIC ("" without one): the
	// restored pod's veth takes it over.
	NICMAC     string            `json:"nicMAC,omitempty"`
	Disks      []recordDisk      `json:"disks"`
	Containers []recordContainer `json:"containers"`
}

type recordDisk struct {
	// Name is the snapshot's disk file name ("disk:<name>").
	Name     string `json:"name"`
	ID       string `json:"id"`
	Serial   string `json:"serial"`
	Port     string `json:"port,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

type recordContainer struct {
	// GuestID is the container's id inside the guest.
	GuestID string      `json:"guestID"`
	Spec    *specs.Spec `json:"spec"`
	// Name is the CRI container name (io.kubernetes.cri.container-name),
	// by which containers of a restored pod find their guest twin.
	Name string `json:"name,omitempty"`
	Disk string `json:"disk"`
}

const recordVersion = 1

func parseRecord(b []byte) (*sandboxRecord, error) {
	var r sandboxRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("snapshot sandbox record: %w", err)
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("snapshot sandbox record version %d: this shim reads version %d", r.Version, recordVersion)
	}
	if r.VCPUs < 1 || r.MemoryMiB < 64 || len(r.Containers) == 0 {
		return nil, fmt.Errorf("snapshot sandbox record is incomplete (vcpus %d, memory %d MiB, %d containers)", r.VCPUs, r.MemoryMiB, len(r.Containers))
	}
	return &r, nil
}

// snapshotFingerprint turns the VM's fingerprint into the snapshot format's.
func snapshotFingerprint(f vmm.Fingerprint) snapshot.Fingerprint {
	sf := snapshot.Fingerprint{
		QEMUVersion: f.QEMUVersion,
		MachineType: f.MachineType,
		CPUModel:    f.CPUModel,
		MemoryMiB:   int64(f.MemoryMiB),
		VCPUs:       f.VCPUs,
		Accel:       f.Accel,
		// The host CPU features the guest's model uses (KVM only).
		HostCPUFlags: f.HostCPUFlags,
	}
	if f.KernelSHA256 != "" {
		sf.KernelDigest = "sha256:" + f.KernelSHA256
	}
	if f.InitrdSHA256 != "" {
		sf.InitrdDigest = "sha256:" + f.InitrdSHA256
	}
	for _, d := range f.Devices {
		sf.Devices = append(sf.Devices, snapshot.Device{ID: d.ID, Driver: d.Driver, PCIAddr: d.Bus + "/" + d.Addr})
	}
	return sf
}
