package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
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

func TestParseRecord(t *testing.T) {
	good := `{"version":1,"sandboxID":"s","vcpus":1,"memoryMiB":256,"containers":[{"guestID":"s","disk":"d"}]}`
	if r, err := parseRecord([]byte(good)); err != nil || r.SandboxID != "s" {
		t.Fatalf("parseRecord = %+v, %v", r, err)
	}
	for _, bad := range []string{`{`, `{"version":2,"vcpus":1,"memoryMiB":256,"containers":[{}]}`, `{"version":1,"vcpus":0,"memoryMiB":256,"containers":[{}]}`, `{"version":1,"vcpus":1,"memoryMiB":256}`} {
		if _, err := parseRecord([]byte(bad)); err == nil {
			t.Errorf("parseRecord(%s) accepted", bad)
		}
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
