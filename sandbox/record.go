package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/vmm"
)

// sandboxRecord is the "spec" file of a snapshot: what a restore needs to
// rebuild the VM exactly (device layout, sizes) and to map new containers
// onto the guest's. It is stored encrypted along with the chunks.
//
// Records written before the metadata's fingerprint became the only one
// carry a "fingerprint" of their own (vmm's, other field names); it is
// ignored: the metadata's is the one a restore checks.
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
	RAMInStream bool `json:"ramInStream,omitempty"`
	// NICMAC is the MAC of the guest's pod NIC ("" without one): the
	// restored pod's veth takes it over.
	NICMAC     string            `json:"nicMAC,omitempty"`
	Disks      []recordDisk      `json:"disks"`
	Containers []RecordContainer `json:"containers"`
	// Finished are the CRI names of the pod's containers that had run and
	// ended (init containers): a restored pod may run them again.
	Finished []string `json:"finished,omitempty"`
}

type recordDisk struct {
	// Name is the snapshot's disk file name ("disk:<name>").
	Name     string `json:"name"`
	ID       string `json:"id"`
	Serial   string `json:"serial"`
	Port     string `json:"port,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// RecordContainer is a container of a checkpointed sandbox, as its record
// keeps it.
type RecordContainer struct {
	// GuestID is the container's id inside the guest.
	GuestID string      `json:"guestID"`
	Spec    *specs.Spec `json:"spec"`
	// Name is the CRI container name (io.kubernetes.cri.container-name),
	// by which containers of a restored pod find their guest twin.
	Name string `json:"name,omitempty"`
	Disk string `json:"disk"`
}

const recordVersion = 1

// maxRecordSize bounds the sandbox record, which is read into memory whole:
// a record with a few dozen container specs is tens of KiB.
const maxRecordSize = 1 << 20

// Limits on the record beyond the node's [hypervisor] limits: what a VM of
// this shim can have.
const (
	maxRecordContainers = 64
	maxRecordDisks      = vmm.MaxBootDisks + vmm.MaxHotplugPorts
)

var (
	// recordDiskIDRE is vmm's device id syntax: a disk id names a
	// directory under the sandbox's disk dir and a QEMU device.
	recordDiskIDRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,23}$`)
	recordSerialRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,20}$`)
	recordPortRE   = regexp.MustCompile(`^rp[0-9]{1,2}$`)
)

// recordLimits are the node's limits on the VM a record describes.
type recordLimits struct {
	maxVCPUs, maxMemoryMiB int
}

func nodeRecordLimits(l Limits) recordLimits {
	return recordLimits{maxVCPUs: l.MaxVCPUs, maxMemoryMiB: l.MaxMemoryMiB}
}

// nodeReadLimits gives a snapshot read on this node the node's limits, so
// that Open refuses a snapshot of a VM larger than the node allows.
func nodeReadLimits(o *snapshot.ReadOptions, l Limits) {
	o.MaxVCPUs = l.MaxVCPUs
	o.MaxMemoryMiB = int64(l.MaxMemoryMiB)
	o.MaxDiskSize = l.MaxDiskSize
	o.MaxSpecSize = maxRecordSize
}

// readRecord fetches the sandbox record of an opened snapshot into memory
// (at most maxRecordSize) and decodes it, before a restore creates
// anything on the host. Its VM must be the one the snapshot's metadata
// describes.
func readRecord(ctx context.Context, snap *snapshot.Snapshot, l Limits) (*sandboxRecord, error) {
	b, err := snap.ReadFile(ctx, snapshot.FileSpec, maxRecordSize)
	if err != nil {
		return nil, fmt.Errorf("snapshot sandbox record: %w", err)
	}
	r, err := decodeRecord(b, nodeRecordLimits(l))
	if err != nil {
		return nil, err
	}
	fp := snap.Metadata.Fingerprint
	if int64(r.MemoryMiB) != fp.MemoryMiB || r.VCPUs != fp.VCPUs {
		return nil, fmt.Errorf("snapshot sandbox record: vcpus %d, memoryMiB %d differ from the metadata's fingerprint (vcpus %d, memoryMiB %d): %w",
			r.VCPUs, r.MemoryMiB, fp.VCPUs, fp.MemoryMiB, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// decodeRecord parses and validates every field of a sandbox record: ids
// and names that become path elements or QEMU arguments from a short
// charset, sizes within the node's limits. The error names the field.
func decodeRecord(b []byte, lim recordLimits) (*sandboxRecord, error) {
	if len(b) > maxRecordSize {
		return nil, recordErr("%d bytes, at most %d", len(b), maxRecordSize)
	}
	var r sandboxRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, recordErr("%v", err)
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("snapshot sandbox record version %d: this shim reads version %d: %w", r.Version, recordVersion, errdefs.ErrNotImplemented)
	}
	for _, check := range []func() error{r.checkVM(lim), r.checkDisks, r.checkContainers} {
		if err := check(); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

// recordWrap names the record in an error that already names its field.
func recordWrap(err error) error { return fmt.Errorf("snapshot sandbox record: %w", err) }

func recordErr(format string, a ...any) error {
	return fmt.Errorf("snapshot sandbox record: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
}

func (r *sandboxRecord) checkVM(lim recordLimits) func() error {
	return func() error {
		if err := snapshot.CheckID("sandboxID", r.SandboxID); err != nil {
			return recordWrap(err)
		}
		if r.VCPUs < 1 || r.VCPUs > lim.maxVCPUs {
			return recordErr("vcpus %d: outside [1, %d] ([hypervisor] max_vcpus)", r.VCPUs, lim.maxVCPUs)
		}
		if r.MemoryMiB < vmm.MinMemoryMiB || r.MemoryMiB > lim.maxMemoryMiB {
			return recordErr("memoryMiB %d: outside [%d, %d] ([hypervisor] max_memory)", r.MemoryMiB, vmm.MinMemoryMiB, lim.maxMemoryMiB)
		}
		if r.HotplugPort > vmm.MaxHotplugPorts {
			return recordErr("hotplugPorts %d: at most %d", r.HotplugPort, vmm.MaxHotplugPorts)
		}
		if r.NICMAC != "" {
			if hw, err := net.ParseMAC(r.NICMAC); err != nil || len(hw) != 6 {
				return recordErr("nicMAC %q: not a 48-bit MAC", r.NICMAC)
			}
		}
		return nil
	}
}

func (r *sandboxRecord) checkDisks() error {
	if len(r.Disks) > maxRecordDisks {
		return recordErr("disks: %d, at most %d", len(r.Disks), maxRecordDisks)
	}
	names, ids := map[string]bool{}, map[string]bool{}
	for i, d := range r.Disks {
		if err := snapshot.CheckDiskName(fmt.Sprintf("disks[%d].name", i), d.Name); err != nil {
			return recordWrap(err)
		}
		if !recordDiskIDRE.MatchString(d.ID) {
			return recordErr("disks[%d].id %q: want %s", i, d.ID, recordDiskIDRE)
		}
		if d.Serial != "" && !recordSerialRE.MatchString(d.Serial) {
			return recordErr("disks[%d].serial %q: want %s", i, d.Serial, recordSerialRE)
		}
		if d.Port != "" && !recordPortRE.MatchString(d.Port) {
			return recordErr("disks[%d].port %q: want %s", i, d.Port, recordPortRE)
		}
		if names[d.Name] || ids[d.ID] {
			return recordErr("disks[%d]: name %q or id %q listed twice", i, d.Name, d.ID)
		}
		names[d.Name], ids[d.ID] = true, true
	}
	return nil
}

func (r *sandboxRecord) checkContainers() error {
	if len(r.Containers) == 0 || len(r.Containers) > maxRecordContainers {
		return recordErr("containers: %d, want 1 to %d", len(r.Containers), maxRecordContainers)
	}
	ids := map[string]bool{}
	for i, c := range r.Containers {
		f := fmt.Sprintf("containers[%d]", i)
		if err := snapshot.CheckID(f+".guestID", c.GuestID); err != nil {
			return recordWrap(err)
		}
		if ids[c.GuestID] {
			return recordErr("%s.guestID %q listed twice", f, c.GuestID)
		}
		ids[c.GuestID] = true
		if c.Name != "" {
			if err := snapshot.CheckID(f+".name", c.Name); err != nil {
				return recordWrap(err)
			}
		}
		// The disk id names the container's work dir under the
		// sandbox's disk dir.
		if !recordDiskIDRE.MatchString(c.Disk) {
			return recordErr("%s.disk %q: want %s", f, c.Disk, recordDiskIDRE)
		}
		if c.Spec == nil {
			return recordErr("%s.spec: missing", f)
		}
		if err := snapshot.CheckHostname(f+".spec.hostname", c.Spec.Hostname); err != nil {
			return recordWrap(err)
		}
	}
	if len(r.Finished) > maxRecordContainers {
		return recordErr("finished: %d names, want at most %d", len(r.Finished), maxRecordContainers)
	}
	for i, name := range r.Finished {
		if err := snapshot.CheckID(fmt.Sprintf("finished[%d]", i), name); err != nil {
			return recordWrap(err)
		}
	}
	return nil
}
