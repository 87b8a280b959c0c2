package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/fetch"
	"github.com/cryo-runtime/cryo/internal/safefs"
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

func TestClaim(t *testing.T) {
	rec := &sandboxRecord{SandboxID: "pod", Containers: []recordContainer{
		{GuestID: "pod", Name: ""}, {GuestID: "app1", Name: "app"}, {GuestID: "side1", Name: "sidecar"},
	}}
	rs := &restoredSandbox{record: rec, pending: map[string]recordContainer{}}
	for _, c := range rec.Containers {
		rs.pending[c.GuestID] = c
	}
	if c, ok := rs.claim(map[string]string{}, true); !ok || c.GuestID != "pod" {
		t.Fatalf("first task claimed %+v %v, want the sandbox container", c, ok)
	}
	if c, ok := rs.claim(map[string]string{criContainerName: "sidecar"}, false); !ok || c.GuestID != "side1" {
		t.Fatalf("sidecar claimed %+v %v", c, ok)
	}
	if _, ok := rs.claim(map[string]string{criContainerName: "sidecar"}, false); ok {
		t.Fatal("a guest container was claimed twice")
	}
	if _, ok := rs.claim(map[string]string{criContainerName: "other"}, false); ok {
		t.Fatal("a container with an unknown name claimed a guest container")
	}
}

// goodRecord is a record as a checkpoint writes it.
func goodRecord() *sandboxRecord {
	fp := vmm.Fingerprint{QEMUVersion: "7.2.19", MachineType: "pc-q35-7.2", CPUModel: "qemu64", Accel: "tcg", MemoryMiB: 256, VCPUs: 1,
		Devices: []vmm.Device{{ID: "root-0a1b2c3d4e5f", Driver: "virtio-blk-pci", Bus: "pcie.0", Addr: "0x3"}}, KernelSHA256: strings.Repeat("ab", 32)}
	return &sandboxRecord{
		Version: recordVersion, SandboxID: "s", VCPUs: 1, MemoryMiB: 256, HotplugPort: 8, Fingerprint: fp, NICMAC: "02:00:00:00:00:01",
		Disks:      []recordDisk{{Name: "root-0a1b2c3d4e5f", ID: "root-0a1b2c3d4e5f", Serial: "cryo0a1b2c3d4e5f6a7b"}},
		Containers: []recordContainer{{GuestID: "s", Name: "app", Disk: "root-0a1b2c3d4e5f", Spec: &specs.Spec{Hostname: "web-0"}}},
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
		{"too many containers", "containers:", func(r *sandboxRecord) {
			for i := range maxRecordContainers {
				r.Containers = append(r.Containers, recordContainer{GuestID: fmt.Sprintf("c%d", i), Disk: "d", Spec: &specs.Spec{}})
			}
		}},
		{"sandbox id", "sandboxID", func(r *sandboxRecord) { r.SandboxID = "../s" }},
		{"vcpus over max_vcpus", "max_vcpus", func(r *sandboxRecord) { r.VCPUs, r.Fingerprint.VCPUs = 5, 5 }},
		{"no vcpus", "vcpus 0", func(r *sandboxRecord) { r.VCPUs, r.Fingerprint.VCPUs = 0, 0 }},
		{"memory over max_memory", "max_memory", func(r *sandboxRecord) { r.MemoryMiB, r.Fingerprint.MemoryMiB = 4096, 4096 }},
		{"memory under the minimum", "memoryMiB 1", func(r *sandboxRecord) { r.MemoryMiB, r.Fingerprint.MemoryMiB = 1, 1 }},
		{"fingerprint differs from the record", "fingerprint.vcpus", func(r *sandboxRecord) { r.Fingerprint.VCPUs = 4 }},
		{"hotplug ports", "hotplugPorts", func(r *sandboxRecord) { r.HotplugPort = 1000 }},
		{"nic mac", "nicMAC", func(r *sandboxRecord) { r.NICMAC = "02:00:00:00:00:01:02:03" }},
		{"machine type with a newline", "fingerprint.machineType", func(r *sandboxRecord) { r.Fingerprint.MachineType = "pc\n" }},
		{"kernel digest", "fingerprint.kernelSHA256", func(r *sandboxRecord) { r.Fingerprint.KernelSHA256 = "../x" }},
		{"device id", "fingerprint.devices[0].id", func(r *sandboxRecord) { r.Fingerprint.Devices[0].ID = strings.Repeat("x", 65) }},
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
	for _, bad := range []string{`{`, `{"version":2}`, `[]`} {
		if _, err := decodeRecord([]byte(bad), lim); err == nil {
			t.Errorf("decodeRecord(%s) accepted", bad)
		}
	}
	if _, err := decodeRecord(bytes.Repeat([]byte(" "), maxRecordSize+1), lim); !errdefs.IsInvalidArgument(err) {
		t.Errorf("oversize record: %v", err)
	}
}

func TestGuestFiles(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 10.0.0.10\n"), 0o644)
	secrets := filepath.Join(dir, "secrets")
	os.MkdirAll(filepath.Join(secrets, "..data"), 0o755)
	os.WriteFile(filepath.Join(secrets, "..data", "token"), []byte("t0ken"), 0o600)
	os.Symlink("..data/token", filepath.Join(secrets, "token"))
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, maxCopiedFile+1), 0o644)
	s := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "ro"}},
		{Destination: "/var/run/secrets", Type: "bind", Source: secrets, Options: []string{"rbind"}},
		{Destination: "/big", Type: "bind", Source: big, Options: []string{"rbind"}},
		{Destination: "/missing", Source: filepath.Join(dir, "nope"), Options: []string{"bind"}},
		{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/sandbox/shm", Options: []string{"rbind"}},
	}}
	files := guestFiles(t.Context(), s)
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = string(f.Content)
	}
	if got["/etc/resolv.conf"] != "nameserver 10.0.0.10\n" || got["/var/run/secrets/token"] != "t0ken" || got["/var/run/secrets/..data/token"] != "t0ken" {
		t.Fatalf("copied files: %v", got)
	}
	if _, ok := got["/big"]; ok {
		t.Fatal("a file over the limit was copied")
	}
	if len(s.Mounts) != 2 || s.Mounts[0].Destination != "/proc" || s.Mounts[1].Destination != "/dev/shm" {
		t.Fatalf("bind mounts left in the spec: %+v", s.Mounts)
	}
}

// TestGuestFilesHostile: the host side of a bind mount, which other pods
// may write, cannot pull host files into the guest nor block the shim: a
// symlink out of the mount's tree, a FIFO, a socket or a device refuses
// the mount at once; one inside the tree is followed.
func TestGuestFilesHostile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "host-secret")
	os.WriteFile(secret, []byte("root's secret"), 0o600)
	mk := func(name string, fill func(d string)) string {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "ok"), []byte("ok"), 0o644)
		fill(d)
		return d
	}
	mounts := map[string]string{
		"/abs-link": mk("abs", func(d string) { os.Symlink(secret, filepath.Join(d, "x")) }),
		"/rel-link": mk("rel", func(d string) { os.Symlink("../host-secret", filepath.Join(d, "x")) }),
		"/deep-link": mk("deep", func(d string) {
			os.MkdirAll(filepath.Join(d, "a"), 0o755)
			os.Symlink("../../host-secret", filepath.Join(d, "a", "x"))
		}),
		"/dir-link": mk("dirlink", func(d string) { os.Symlink(dir, filepath.Join(d, "up")) }),
		"/fifo":     mk("fifo", func(d string) { syscall.Mkfifo(filepath.Join(d, "x"), 0o600) }),
		"/socket":   mk("socket", func(d string) { syscall.Mknod(filepath.Join(d, "x"), syscall.S_IFSOCK|0o600, 0) }),
		"/inside":   mk("inside", func(d string) { os.Symlink("ok", filepath.Join(d, "alias")) }),
	}
	fifo := filepath.Join(dir, "single-fifo")
	syscall.Mkfifo(fifo, 0o600)
	mounts["/single-fifo"] = fifo
	s := &specs.Spec{}
	for dst, src := range mounts {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src})
	}
	done := make(chan []guestFile, 1)
	go func() { done <- guestFiles(t.Context(), s) }()
	var files []guestFile
	select {
	case files = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("guestFiles blocked")
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = string(f.Content)
		if strings.Contains(string(f.Content), "secret") {
			t.Errorf("%s carries a host file into the guest", f.Path)
		}
	}
	want := map[string]string{"/inside/ok": "ok", "/inside/alias": "ok"}
	if len(got) != len(want) || got["/inside/ok"] != "ok" || got["/inside/alias"] != "ok" {
		t.Fatalf("copied %v, want %v", got, want)
	}
}

// TestReadCheckpointRef: containerd's checkpoint directory holds what a
// checkpoint image carried; its reference is decoded strictly and never
// read through a symlink, and the store under it follows none.
func TestReadCheckpointRef(t *testing.T) {
	const d = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	write := func(t *testing.T, ref string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, checkpointRefFile), []byte(ref), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := write(t, `{"local":"checkpoint","digest":"`+d+`"}`)
	src, err := readCheckpointRef(dir)
	if err != nil || !src.Trusted || src.URL != "file://"+dir+"/snapshot/cryo:checkpoint" || src.Digest != d {
		t.Fatalf("local ref: %+v, %v", src, err)
	}
	if src, err := readCheckpointRef(write(t, `{"url":"s3://b/p:v1","digest":"`+d+`"}`)); err != nil || src.Trusted || src.URL != "s3://b/p:v1" {
		t.Fatalf("url ref: %+v, %v", src, err)
	}
	for _, bad := range []string{
		`{"local":"../../etc:x"}`, `{"local":"a/b"}`, `{"local":"checkpoint","digest":"sha256:../x"}`,
		`{"local":"checkpoint","digest":"md5:1"}`, `{}`, `{"url":"s3://b/p:v1\n"}`, `[`,
	} {
		if _, err := readCheckpointRef(write(t, bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want a refusal", bad, err)
		}
	}
	// The reference itself a symlink to a file elsewhere, or a FIFO.
	other := write(t, `{"local":"checkpoint"}`)
	link := t.TempDir()
	os.Symlink(filepath.Join(other, checkpointRefFile), filepath.Join(link, checkpointRefFile))
	if _, err := readCheckpointRef(link); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("symlinked reference: %v", err)
	}
	fifo := t.TempDir()
	syscall.Mkfifo(filepath.Join(fifo, checkpointRefFile), 0o600)
	if _, err := readCheckpointRef(fifo); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("FIFO reference: %v", err)
	}
	// snapshot/ a symlink to a store elsewhere: the store refuses it.
	target := t.TempDir()
	os.Symlink(target, filepath.Join(dir, "snapshot"))
	if _, err := fetch.NewFileStore(filepath.Join(dir, "snapshot", "cryo")); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("store through a symlinked snapshot dir: %v", err)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("created %v through the symlink", ents)
	}
}

func TestHostFactsCache(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "vmlinuz")
	os.WriteFile(f, []byte("kernel v1"), 0o644)
	c := hostFactsCache{path: filepath.Join(dir, "cache", "facts.json")}
	calls := 0
	compute := func(p string) (string, error) { calls++; return digestFile(p) }
	d1, err := c.get(f, "sha256", compute)
	if err != nil || !strings.HasPrefix(d1, "sha256:") {
		t.Fatalf("get = %q, %v", d1, err)
	}
	if d, _ := c.get(f, "sha256", compute); d != d1 || calls != 1 {
		t.Fatalf("second get = %q after %d computations, want a cache hit", d, calls)
	}
	// a changed file is a miss
	os.WriteFile(f, []byte("kernel v2, longer"), 0o644)
	if d, _ := c.get(f, "sha256", compute); d == d1 || calls != 2 {
		t.Fatalf("changed file: %q after %d computations", d, calls)
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
	g, err := hostGuestDigests(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := g.apply(vmm.Config{Kernel: kernel, Initrd: initrd})
	for _, f := range []struct{ path, got string }{{kernel, c.KernelSHA256}, {initrd, c.InitrdSHA256}} {
		want, _ := digestFile(f.path)
		if "sha256:"+f.got != want {
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
	if g, err := hostGuestDigests(cfg); err == nil || !strings.Contains(err.Error(), "guest kernel") {
		t.Errorf("digests with a missing kernel: %+v, %v", g, err)
	}
}
