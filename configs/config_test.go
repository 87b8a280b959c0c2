package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/nodecache"
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
		{name: "restore mode", body: "[restore]\nmode = \"lazy\"\nprefetch_workers = 2\npage_timeout = \"5s\"\n",
			check: func(c Config) bool {
				return c.Restore.Mode == RestoreLazy && c.Restore.Allows(RestoreLazy) && c.Restore.Allows(RestoreEager) &&
					c.Restore.PrefetchWorkers == 2 && c.Restore.PageTimeout.Seconds() == 5
			}},
		{name: "restore mode default", body: "[restore]\nfallback = \"cold\"\n",
			check: func(c Config) bool {
				return c.Restore.Mode == RestoreLazy && c.Restore.Allows(RestoreLazy) && c.Restore.Allows(RestoreEager) && !c.Restore.Allows("") &&
					c.Snapshot.ChunkSizeMiB == 1
			}},
		{name: "eager node", body: "[restore]\nmode = \"eager\"\n",
			check: func(c Config) bool {
				return c.Restore.Mode == RestoreEager && !c.Restore.Allows(RestoreLazy) && c.Restore.Allows(RestoreEager)
			}},
		{name: "lazy allowed", body: "[restore]\nmode = \"eager\"\nallowed_modes = [\"lazy\"]\n",
			check: func(c Config) bool { return c.Restore.Mode == RestoreEager && c.Restore.Allows(RestoreLazy) }},
		{name: "bad restore mode", body: "[restore]\nmode = \"postcopy\"\n", wantErr: "restore.mode"},
		{name: "bad allowed mode", body: "[restore]\nallowed_modes = [\"eager\", \"fast\"]\n", wantErr: "restore.allowed_modes"},
		{name: "prefetch workers", body: "[restore]\nprefetch_workers = -1\n", wantErr: "restore.prefetch_workers"},
		{name: "page timeout", body: "[restore]\npage_timeout = \"1ms\"\n", wantErr: "restore.page_timeout"},
		{name: "restore limits", body: "[restore]\nmax_disk_size = 2048\nmax_device_state = 16\n",
			check: func(c Config) bool { return c.Restore.MaxDiskSizeMiB == 2048 && c.Restore.MaxDeviceStateMiB == 16 }},
		{name: "restore limits default", body: "[restore]\nfallback = \"cold\"\n",
			check: func(c Config) bool { return c.Restore.MaxDiskSizeMiB == 65536 && c.Restore.MaxDeviceStateMiB == 64 }},
		{name: "max disk size under writable disk", body: "[runtime]\nwritable_disk_size = 4096\n[restore]\nmax_disk_size = 2048\n", wantErr: "restore.max_disk_size"},
		{name: "max disk size zero", body: "[restore]\nmax_disk_size = 0\n", wantErr: "restore.max_disk_size"},
		{name: "max disk size over 4 TiB", body: "[restore]\nmax_disk_size = 4194305\n", wantErr: "restore.max_disk_size"},
		{name: "max device state zero", body: "[restore]\nmax_device_state = 0\n", wantErr: "restore.max_device_state"},
		{name: "max device state over 1 GiB", body: "[restore]\nmax_device_state = 1025\n", wantErr: "restore.max_device_state"},
		{name: "download bounds", body: "[stores]\ndownload_deadline = \"20s\"\nmin_download_rate_kib = 1024\n",
			check: func(c Config) bool {
				o := c.Stores.CachingOptions("s3://b/ns/app:v1")
				return c.Stores.DownloadDeadline.Seconds() == 20 && c.Stores.MinDownloadRateKiB == 1024 &&
					o.DownloadDeadline == 20*time.Second && o.MinRate == 1<<20 && o.StoreID == nodecache.StoreID("s3://b/ns/app:v2")
			}},
		{name: "download bounds default", body: "[stores]\nmax_concurrent_fetches = 4\n",
			check: func(c Config) bool {
				return c.Stores.DownloadDeadline.Seconds() == 60 && c.Stores.MinDownloadRateKiB == 256
			}},
		{name: "download deadline too short", body: "[stores]\ndownload_deadline = \"10ms\"\n", wantErr: "stores.download_deadline"},
		{name: "download deadline too long", body: "[stores]\ndownload_deadline = \"2h\"\n", wantErr: "stores.download_deadline"},
		{name: "download rate zero", body: "[stores]\nmin_download_rate_kib = 0\n", wantErr: "stores.min_download_rate_kib"},
		{name: "download rate negative", body: "[stores]\nmin_download_rate_kib = -5\n", wantErr: "stores.min_download_rate_kib"},
		{name: "booted ram default", body: "[restore]\nfallback = \"cold\"\n",
			check: func(c Config) bool { return c.Memory.Booted == BootedOwned }},
		{name: "booted ram served", body: "[memory]\nbooted = \"served\"\n",
			check: func(c Config) bool { return c.Memory.Booted == BootedServed }},
		{name: "booted ram bad", body: "[memory]\nbooted = \"lazy\"\n", wantErr: "memory.booted"},
		{name: "booted ram empty", body: "[memory]\nbooted = \"\"\n", wantErr: "memory.booted"},
		{name: "clones default", body: "",
			check: func(c Config) bool { return c.Memory.Clones == ClonesPrivate }},
		{name: "clones shared", body: "[memory]\nclones = \"shared\"\n",
			check: func(c Config) bool { return c.Memory.Clones == ClonesShared }},
		{name: "clones bad", body: "[memory]\nclones = \"lazy\"\n", wantErr: "memory.clones"},
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

// TestFailClosedDefaults: a configured key requires what it is for unless
// the file explicitly says otherwise; unset and false are told apart.
func TestFailClosedDefaults(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body string
		sig, enc   bool
		wantErr    string
	}{
		{name: "nothing", body: "", sig: false, enc: false},
		{name: "verify key", body: "[snapshot]\nverify_key = \"/k.pub\"\n", sig: true},
		{name: "verify key, explicitly optional", body: "[snapshot]\nverify_key = \"/k.pub\"\nrequire_signature = false\n", sig: false},
		{name: "encryption key", body: "[snapshot]\nencryption_key = \"/k\"\n", enc: true},
		{name: "key dir", body: "[snapshot]\nencryption_key_dir = \"/etc/cryo/keys\"\n", enc: true},
		{name: "encryption key, explicitly optional", body: "[snapshot]\nencryption_key = \"/k\"\nrequire_encryption = false\n", enc: false},
		{name: "require without key", body: "[snapshot]\nrequire_signature = true\n", wantErr: "verify_key is not"},
		{name: "require encryption without key", body: "[snapshot]\nrequire_encryption = true\n", wantErr: "neither"},
		{name: "node key and key dir", body: "[snapshot]\nencryption_key = \"/k\"\nencryption_key_dir = \"/d\"\n", wantErr: "both set"},
		{name: "relative key dir", body: "[snapshot]\nencryption_key_dir = \"keys\"\n", wantErr: "encryption_key_dir"},
		{name: "placeholder in host", body: "[stores]\nallowed = [\"oci://{namespace}/\"]\n", wantErr: "whole path segment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "c.toml")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load = %v, want error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Snapshot.SignatureRequired(); got != tc.sig {
				t.Errorf("SignatureRequired = %v, want %v", got, tc.sig)
			}
			if got := c.Snapshot.EncryptionRequired(); got != tc.enc {
				t.Errorf("EncryptionRequired = %v, want %v", got, tc.enc)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml")); err == nil {
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
