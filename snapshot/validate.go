package snapshot

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"unicode"
	"unicode/utf8"

	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/stores"
)

// Every byte of a snapshot comes from a store that other parties may write
// and from a guest that chose its own RAM and disks. Open decodes all of it
// here, before anything is created on the host: names and ids that may
// become path elements from a short charset, every other string short and
// printable, every size and count within the reader's limits. A refusal
// names the field (as FORMAT.md spells it) and wraps
// errdefs.ErrInvalidArgument.

// Limits of the metadata that the reader does not take from ReadOptions:
// far above what any sandbox has, small enough that a hostile config costs
// nothing to decode.
const (
	maxContainers  = 64
	maxLayerChain  = 512
	maxInterfaces  = 16
	maxAddresses   = 64
	maxDNS         = 16
	maxDevices     = 256
	maxAnnotations = 256
	maxTextLen     = 1024
	maxLongText    = 16 << 10
	maxHostname    = 253
)

// CheckID refuses an id that is not a containerd identifier: alphanumerics
// separated by single '.', '_' or '-', at most 76 characters. Such an id has
// no '/', no "..", no NUL, and is safe as one path element.
func CheckID(field, id string) error {
	if err := identifiers.Validate(id); err != nil {
		return fmt.Errorf("%s %q: not an identifier ([A-Za-z0-9]+ joined by one of ._-, at most 76 characters): %w", field, id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckDiskName refuses a disk name that the format does not allow
// ([A-Za-z0-9][A-Za-z0-9._-]{0,63}: no '/', never "." or ".."): the name
// becomes the file disk-<name> of a materialized snapshot.
func CheckDiskName(field, name string) error {
	if !diskNameRE.MatchString(name) {
		return fmt.Errorf("%s %q: want %s: %w", field, name, diskNameRE, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckText refuses a string longer than max bytes, not UTF-8, or holding a
// control character (NUL, newline, escape...): such strings reach logs,
// error messages and `cryoctl inspect`.
func CheckText(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s: %d bytes, at most %d: %w", field, len(s), max, errdefs.ErrInvalidArgument)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q: not UTF-8: %w", field, s, errdefs.ErrInvalidArgument)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q: control character %U: %w", field, s, r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)

// CheckHostname refuses what is not an RFC 1123 host name ("" is allowed).
func CheckHostname(field, h string) error {
	if h != "" && (len(h) > maxHostname || !hostnameRE.MatchString(h)) {
		return fmt.Errorf("%s %q: not a host name: %w", field, h, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkCount refuses a list longer than max.
func checkCount(field string, n, max int) error {
	if n > max {
		return fmt.Errorf("%s: %d entries, at most %d: %w", field, n, max, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateFields checks every field of the metadata that validateMetadata
// does not: what the sandbox was, against this node's limits, and every
// free-form string.
func (s *Snapshot) validateFields() error {
	md := &s.Metadata
	checks := []func() error{
		func() error { return s.validateFingerprint(&md.Fingerprint) },
		func() error { return s.validateContainers(md.Containers) },
		func() error { return validateNetwork(&md.Network) },
		func() error { return validateSource(&md.Source) },
		func() error { return validateAnnotations("annotations", md.Annotations) },
		func() error { return validateTotals(&md.Totals) },
		func() error { return validateCheckpointAnnotations(md) },
		func() error { return validateWorkingSet(md) },
	}
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Snapshot) validateFingerprint(f *fingerprint.Fingerprint) error {
	if f.VCPUs < 0 || f.MemoryMiB < 0 {
		return fmt.Errorf("fingerprint.vcpus %d, fingerprint.memoryMiB %d: negative: %w", f.VCPUs, f.MemoryMiB, errdefs.ErrInvalidArgument)
	}
	if s.opts.MaxVCPUs > 0 && f.VCPUs > s.opts.MaxVCPUs {
		return fmt.Errorf("fingerprint.vcpus %d: this node allows at most %d vcpus: %w", f.VCPUs, s.opts.MaxVCPUs, errdefs.ErrInvalidArgument)
	}
	if s.opts.MaxMemoryMiB > 0 && f.MemoryMiB > s.opts.MaxMemoryMiB {
		return fmt.Errorf("fingerprint.memoryMiB %d: this node allows at most %d MiB: %w", f.MemoryMiB, s.opts.MaxMemoryMiB, errdefs.ErrInvalidArgument)
	}
	for _, t := range []struct{ field, v string }{
		{"fingerprint.qemuVersion", f.QEMUVersion}, {"fingerprint.machineType", f.MachineType},
		{"fingerprint.cpuModel", f.CPUModel}, {"fingerprint.kernelDigest", f.KernelDigest},
		{"fingerprint.initrdDigest", f.InitrdDigest}, {"fingerprint.accel", f.Accel},
	} {
		if err := CheckText(t.field, t.v, maxTextLen); err != nil {
			return err
		}
	}
	if err := checkCount("fingerprint.hostCPUFlags", len(f.HostCPUFlags), maxDevices); err != nil {
		return err
	}
	for _, fl := range f.HostCPUFlags {
		if err := CheckText("fingerprint.hostCPUFlags[]", fl, 64); err != nil {
			return err
		}
	}
	if err := checkCount("fingerprint.devices", len(f.Devices), maxDevices); err != nil {
		return err
	}
	for i, d := range f.Devices {
		for _, t := range []struct{ field, v string }{{"id", d.ID}, {"driver", d.Driver}, {"pciAddr", d.PCIAddr}} {
			if err := CheckText(fmt.Sprintf("fingerprint.devices[%d].%s", i, t.field), t.v, 128); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Snapshot) validateContainers(cs []Container) error {
	if err := checkCount("containers", len(cs), maxContainers); err != nil {
		return err
	}
	for i, c := range cs {
		if err := CheckID(fmt.Sprintf("containers[%d].id", i), c.ID); err != nil {
			return err
		}
		if err := CheckText(fmt.Sprintf("containers[%d].image", i), c.Image, maxTextLen); err != nil {
			return err
		}
		if err := checkCount(fmt.Sprintf("containers[%d].layerChain", i), len(c.LayerChain), maxLayerChain); err != nil {
			return err
		}
		for _, d := range c.LayerChain {
			if err := stores.CheckDigest(d); err != nil {
				return fmt.Errorf("containers[%d].layerChain: %w", i, err)
			}
		}
		if int64(len(c.Spec)) > s.opts.MaxSpecSize {
			return fmt.Errorf("containers[%d].spec: %d bytes, at most %d: %w", i, len(c.Spec), s.opts.MaxSpecSize, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func validateNetwork(n *Network) error {
	if err := CheckHostname("network.hostname", n.Hostname); err != nil {
		return err
	}
	if err := checkCount("network.interfaces", len(n.Interfaces), maxInterfaces); err != nil {
		return err
	}
	for i, it := range n.Interfaces {
		f := fmt.Sprintf("network.interfaces[%d]", i)
		if err := checkIfName(f+".name", it.Name); err != nil {
			return err
		}
		if _, err := net.ParseMAC(it.MAC); it.MAC != "" && err != nil {
			return fmt.Errorf("%s.mac %q: %w", f, it.MAC, errdefs.ErrInvalidArgument)
		}
		if err := checkCount(f+".addresses", len(it.Addresses), maxAddresses); err != nil {
			return err
		}
		for _, a := range it.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("%s.addresses %q: %w", f, a, errdefs.ErrInvalidArgument)
			}
		}
		if _, err := netip.ParseAddr(it.Gateway); it.Gateway != "" && err != nil {
			return fmt.Errorf("%s.gateway %q: %w", f, it.Gateway, errdefs.ErrInvalidArgument)
		}
	}
	if err := checkCount("network.dns", len(n.DNS), maxDNS); err != nil {
		return err
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("network.dns %q: %w", d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

var ifNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$`)

// checkIfName refuses what Linux would not take as an interface name.
func checkIfName(field, name string) error {
	if !ifNameRE.MatchString(name) {
		return fmt.Errorf("%s %q: want %s: %w", field, name, ifNameRE, errdefs.ErrInvalidArgument)
	}
	return nil
}

func validateSource(src *SourceInfo) error {
	for _, t := range []struct{ field, v string }{
		{"source.sandboxID", src.SandboxID}, {"source.podName", src.PodName}, {"source.namespace", src.Namespace},
		{"source.podUID", src.PodUID}, {"source.node", src.Node}, {"source.runtimeType", src.RuntimeType},
	} {
		if err := CheckText(t.field, t.v, 256); err != nil {
			return err
		}
	}
	return nil
}

func validateAnnotations(field string, a map[string]string) error {
	if err := checkCount(field, len(a), maxAnnotations); err != nil {
		return err
	}
	for k, v := range a {
		if err := CheckText(field+" key", k, 256); err != nil {
			return err
		}
		if err := CheckText(field+"["+k+"]", v, maxLongText); err != nil {
			return err
		}
	}
	return nil
}

// validateWorkingSet checks that every working-set index names a chunk of
// the ram file, once.
func validateWorkingSet(md *Metadata) error {
	if len(md.WorkingSet) == 0 {
		return nil
	}
	var size int64 = -1
	for _, f := range md.Files {
		if f.Name == FileRAM {
			size = f.Size
		}
	}
	if size < 0 || md.ChunkSize <= 0 {
		return fmt.Errorf("workingSet: %d entries, but the snapshot has no ram file in chunks: %w", len(md.WorkingSet), errdefs.ErrInvalidArgument)
	}
	n := (size + md.ChunkSize - 1) / md.ChunkSize
	if int64(len(md.WorkingSet)) > n {
		return fmt.Errorf("workingSet: %d entries, the ram file has %d chunks: %w", len(md.WorkingSet), n, errdefs.ErrInvalidArgument)
	}
	seen := make(map[int64]bool, len(md.WorkingSet))
	for i, idx := range md.WorkingSet {
		if idx < 0 || idx >= n || seen[idx] {
			return fmt.Errorf("workingSet[%d] %d: not a chunk of the ram file (0 to %d), or listed twice: %w", i, idx, n-1, errdefs.ErrInvalidArgument)
		}
		seen[idx] = true
	}
	return nil
}

func validateTotals(t *Totals) error {
	if t.RawBytes < 0 || t.DataBytes < 0 || t.StoredBytes < 0 || t.Chunks < 0 || t.Deltas < 0 || t.Bases < 0 {
		return fmt.Errorf("totals: negative count %+v: %w", *t, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateCheckpointAnnotations checks the annotations that cryo's own
// checkpoints record and that a controller reads back as figures.
func validateCheckpointAnnotations(md *Metadata) error {
	if _, _, err := pauseWindow(md.Annotations); err != nil {
		return fmt.Errorf("annotations[%s] %q: want a duration of at least 0: %w",
			AnnotationPauseWindow, md.Annotations[AnnotationPauseWindow], errdefs.ErrInvalidArgument)
	}
	v, ok := md.Annotations[AnnotationUploadedBytes]
	if !ok {
		return nil
	}
	n, err := parseDec(v)
	if err != nil || n > md.Totals.StoredBytes {
		return fmt.Errorf("annotations[%s] %q: want a decimal of at most totals.storedBytes (%d): %w",
			AnnotationUploadedBytes, v, md.Totals.StoredBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

var keyIDRE = regexp.MustCompile(`^sha256:[0-9a-f]{32}$`)

func checkKeyID(id string) error {
	if !keyIDRE.MatchString(id) {
		return fmt.Errorf("encryption.keyID %q: want %s: %w", id, keyIDRE, errdefs.ErrInvalidArgument)
	}
	return nil
}
