package nodecache

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/internal/atomicfile"
)

// HostFacts remembers facts about host files (QEMU's version, the guest
// kernel's digest) across processes, in one JSON file keyed by fact, path,
// size and modification time: every restore is a new shim, and hashing the
// kernel or running QEMU costs tens of milliseconds of a restore.
type HostFacts struct{ path string }

// Get returns the fact about file (looked up in PATH when not absolute),
// computing it with compute (called with the absolute path) when the file
// changed or was never seen. Losing a write costs one recomputation.
func (h HostFacts) Get(file, fact string, compute func(string) (string, error)) (string, error) {
	bin := file
	if !filepath.IsAbs(bin) {
		p, err := exec.LookPath(bin)
		if err != nil {
			return "", err
		}
		bin = p
	}
	st, err := os.Stat(bin)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s %s %d %d", fact, bin, st.Size(), st.ModTime().UnixNano())
	facts := map[string]string{}
	if b, err := os.ReadFile(h.path); err == nil {
		_ = json.Unmarshal(b, &facts)
	}
	if v, ok := facts[key]; ok {
		return v, nil
	}
	v, err := compute(bin)
	if err != nil {
		return "", err
	}
	facts[key] = v
	if b, err := json.Marshal(facts); err == nil && os.MkdirAll(filepath.Dir(h.path), 0o700) == nil {
		_ = atomicfile.Write(h.path, b, 0o600)
	}
	return v, nil
}

// QEMUVersion is the version ("7.2.19") of the QEMU binary qemu.
func (h HostFacts) QEMUVersion(qemu string) (string, error) {
	return h.Get(qemu, "qemu-version", fingerprint.QEMUVersion)
}

// GuestDigests are the sha256 digests ("sha256:<hex>") of the guest kernel
// and initrd.
type GuestDigests struct{ Kernel, Initrd string }

// GuestDigests returns the digests of the guest kernel and initrd.
func (h HostFacts) GuestDigests(kernel, initrd string) (GuestDigests, error) {
	var g GuestDigests
	var err error
	if g.Kernel, err = h.Get(kernel, "sha256", digestFile); err != nil {
		return g, fmt.Errorf("guest kernel: %w", err)
	}
	if g.Initrd, err = h.Get(initrd, "sha256", digestFile); err != nil {
		return g, fmt.Errorf("guest initrd: %w", err)
	}
	return g, nil
}

func digestFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	d, err := digest.SHA256.FromReader(f)
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
