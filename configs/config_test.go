package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "config.toml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, body, wantErr string
		check               func(Config) bool
	}{
		{name: "override", body: "[hypervisor]\ndefault_memory = 1024\naccel = \"kvm\"\n[agent]\ndial_timeout = \"5s\"\n",
			check: func(c Config) bool {
				return c.Hypervisor.MemoryMiB == 1024 && c.Hypervisor.Accel == "kvm" && c.Agent.DialTimeout.Seconds() == 5 && c.Hypervisor.CPUModel == "qemu64"
			}},
		{name: "alias machine", body: "[hypervisor]\nmachine_type = \"q35\"\n", wantErr: "versioned machine type"},
		{name: "bad accel", body: "[hypervisor]\naccel = \"xen\"\n", wantErr: "hypervisor.accel"},
		{name: "unknown key", body: "[hypervisor]\nkernal = \"/x\"\n", wantErr: "unknown setting"},
		{name: "relative kernel", body: "[hypervisor]\nkernel = \"vmlinuz\"\n", wantErr: "hypervisor.kernel"},
		{name: "bad duration", body: "[agent]\ndial_timeout = \"soon\"\n", wantErr: "invalid duration"},
		{name: "memory too small", body: "[hypervisor]\ndefault_memory = 16\n", wantErr: "default_memory"},
		{name: "fallback", body: "[restore]\nfallback = \"maybe\"\n", wantErr: "restore.fallback"},
		{name: "syntax", body: "[hypervisor\n", wantErr: "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(write(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("unexpected config %+v", c)
			}
		})
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); err == nil {
		t.Fatal("explicitly named missing config must be an error")
	}
}

// TestShippedProfiles: every TOML file shipped in configs/ loads and
// validates.
func TestShippedProfiles(t *testing.T) {
	files, err := filepath.Glob("*.toml")
	if err != nil || len(files) < 2 {
		t.Fatalf("shipped profiles: %v %v", files, err)
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
