package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/vmm"
)

func TestPinRef(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	for _, tc := range []struct{ ref, pin, want, err string }{
		{ref: "v1", want: "v1"},
		{ref: "v1", pin: d1, want: "v1@" + d1},
		{ref: "v1@" + d1, pin: d1, want: "v1@" + d1},
		{ref: "v1@" + d1, pin: d2, err: "pins"},
		{ref: d1, pin: d1, want: d1},
	} {
		got, err := pinRef(tc.ref, tc.pin)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("pinRef(%q, %q) error = %v", tc.ref, tc.pin, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("pinRef(%q, %q) = %q, %v; want %q", tc.ref, tc.pin, got, err, tc.want)
		}
	}
}

// goodRecord is a record as a checkpoint writes it.
func goodRecord() *sandboxRecord {
	return &sandboxRecord{
		Version: recordVersion, SandboxID: "s", VCPUs: 1, MemoryMiB: 256, HotplugPort: 8, NICMAC: "02:00:00:00:00:01",
		Disks:      []recordDisk{{Name: "root-0a1b2c3d4e5f", ID: "root-0a1b2c3d4e5f", Serial: "cryo0a1b2c3d4e5f6a7b"}},
		Containers: []RecordContainer{{GuestID: "s", Name: "app", Disk: "root-0a1b2c3d4e5f", Spec: &specs.Spec{Hostname: "web-0"}}},
	}
}

// TestDecodeRecord: every hostile field of a sandbox record is refused,
// naming the field, before anything is made of it.
func TestDecodeRecord(t *testing.T) {
	lim := recordLimits{maxVCPUs: 4, maxMemoryMiB: 2048}
	enc := func(r *sandboxRecord) []byte { b, _ := json.Marshal(r); return b }
	if r, err := decodeRecord(enc(goodRecord()), lim); err != nil || r.SandboxID != "s" {
		t.Fatalf("decodeRecord(good) = %+v, %v", r, err)
	}
	for _, tc := range []struct {
		name, field string
		edit        func(r *sandboxRecord)
	}{
		{"disk name escapes", "disks[0].name", func(r *sandboxRecord) { r.Disks[0].Name = "../../x" }},
		{"disk id escapes", "disks[0].id", func(r *sandboxRecord) { r.Disks[0].ID = "../x" }},
		{"disk id with a slash", "disks[0].id", func(r *sandboxRecord) { r.Disks[0].ID = "a/b" }},
		{"disk id with NUL", "disks[0].id", func(r *sandboxRecord) { r.Disks[0].ID = "a\x00b" }},
		{"disk id too long", "disks[0].id", func(r *sandboxRecord) { r.Disks[0].ID = "d" + strings.Repeat("x", 24) }},
		{"disk serial with a comma", "disks[0].serial", func(r *sandboxRecord) { r.Disks[0].Serial = "a,file=/etc/shadow" }},
		{"disk port", "disks[0].port", func(r *sandboxRecord) { r.Disks[0].Port = "rp0,x=y" }},
		{"disk listed twice", "disks[1]", func(r *sandboxRecord) { r.Disks = append(r.Disks, r.Disks[0]) }},
		{"too many disks", "disks:", func(r *sandboxRecord) {
			for i := range maxRecordDisks {
				r.Disks = append(r.Disks, recordDisk{Name: fmt.Sprintf("d%d", i), ID: fmt.Sprintf("d%d", i)})
			}
		}},
		{"container disk escapes", "containers[0].disk", func(r *sandboxRecord) { r.Containers[0].Disk = "../../../etc" }},
		{"container disk empty", "containers[0].disk", func(r *sandboxRecord) { r.Containers[0].Disk = "" }},
		{"guest id with a slash", "containers[0].guestID", func(r *sandboxRecord) { r.Containers[0].GuestID = "a/b" }},
		{"guest id dot dot", "containers[0].guestID", func(r *sandboxRecord) { r.Containers[0].GuestID = ".." }},
		{"guest id listed twice", "containers[1].guestID", func(r *sandboxRecord) { r.Containers = append(r.Containers, r.Containers[0]) }},
		{"container name", "containers[0].name", func(r *sandboxRecord) { r.Containers[0].Name = "a b" }},
		{"container without a spec", "containers[0].spec", func(r *sandboxRecord) { r.Containers[0].Spec = nil }},
		{"hostname", "containers[0].spec.hostname", func(r *sandboxRecord) { r.Containers[0].Spec.Hostname = "-x;reboot" }},
		{"no containers", "containers:", func(r *sandboxRecord) { r.Containers = nil }},
		{"finished name", "finished[1]", func(r *sandboxRecord) { r.Finished = []string{"init", "../x"} }},
		{"too many finished", "finished:", func(r *sandboxRecord) { r.Finished = make([]string, maxRecordContainers+1) }},
		{"too many containers", "containers:", func(r *sandboxRecord) {
			for i := range maxRecordContainers {
				r.Containers = append(r.Containers, RecordContainer{GuestID: fmt.Sprintf("c%d", i), Disk: "d", Spec: &specs.Spec{}})
			}
		}},
		{"sandbox id", "sandboxID", func(r *sandboxRecord) { r.SandboxID = "../s" }},
		{"vcpus over max_vcpus", "max_vcpus", func(r *sandboxRecord) { r.VCPUs = 5 }},
		{"no vcpus", "vcpus 0", func(r *sandboxRecord) { r.VCPUs = 0 }},
		{"memory over max_memory", "max_memory", func(r *sandboxRecord) { r.MemoryMiB = 4096 }},
		{"memory under the minimum", "memoryMiB 1", func(r *sandboxRecord) { r.MemoryMiB = 1 }},
		{"hotplug ports", "hotplugPorts", func(r *sandboxRecord) { r.HotplugPort = 1000 }},
		{"nic mac", "nicMAC", func(r *sandboxRecord) { r.NICMAC = "02:00:00:00:00:01:02:03" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := goodRecord()
			tc.edit(r)
			_, err := decodeRecord(enc(r), lim)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("decodeRecord: %v, want an invalid argument naming %s", err, tc.field)
			}
			t.Logf("refused: %v", err)
		})
	}
	// A record written before the metadata's fingerprint became the only
	// one still reads; its own fingerprint is ignored.
	old := map[string]any{}
	json.Unmarshal(enc(goodRecord()), &old)
	old["fingerprint"] = map[string]any{"qemuVersion": "7.2.19", "kernelSHA256": "../x", "devices": []any{map[string]any{"id": "blk", "bus": "pcie.0", "addr": "0x3"}}}
	b, _ := json.Marshal(old)
	if r, err := decodeRecord(b, lim); err != nil || r.SandboxID != "s" {
		t.Errorf("record with the old fingerprint field: %+v, %v", r, err)
	}
	for _, bad := range []string{`{`, `{"version":2}`, `[]`} {
		if _, err := decodeRecord([]byte(bad), lim); err == nil {
			t.Errorf("decodeRecord(%s) accepted", bad)
		}
	}
	if _, err := decodeRecord(bytes.Repeat([]byte(" "), maxRecordSize+1), lim); !errdefs.IsInvalidArgument(err) {
		t.Errorf("oversize record: %v", err)
	}
}

func TestHostGuestDigests(t *testing.T) {
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	os.WriteFile(initrd, []byte("initrd"), 0o644)
	cfg := configs.Default()
	cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	cfg.Hypervisor.Kernel, cfg.Hypervisor.Initrd = kernel, initrd
	g, err := hostGuestDigests(testNode(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	c := g.apply(vmm.Config{Kernel: kernel, Initrd: initrd})
	for _, f := range []struct{ path, got string }{{kernel, c.KernelSHA256}, {initrd, c.InitrdSHA256}} {
		b, _ := os.ReadFile(f.path)
		if want := digest.FromBytes(b).String(); "sha256:"+f.got != want {
			t.Errorf("digest of %s = %q, want %s", f.path, f.got, want)
		}
	}
	// They come from the node's host facts, which the next shim reads.
	b, err := os.ReadFile(filepath.Join(cfg.Snapshot.CacheDir, "host-facts.json"))
	if err != nil || !strings.Contains(string(b), c.KernelSHA256) || !strings.Contains(string(b), c.InitrdSHA256) {
		t.Errorf("host facts: %s, %v", b, err)
	}
	// A file that cannot be read is an error: a restore refuses, a boot
	// leaves the hashing to the machine.
	cfg.Hypervisor.Kernel = filepath.Join(dir, "gone")
	if g, err := hostGuestDigests(testNode(t, cfg)); err == nil || !strings.Contains(err.Error(), "guest kernel") {
		t.Errorf("digests with a missing kernel: %+v, %v", g, err)
	}
}
