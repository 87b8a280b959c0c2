// Package configs holds cryo's node configuration: the struct, its defaults,
// the TOML loader and validation. The file is /etc/cryo/config.toml unless
// containerd's runtime options name another (ConfigPath).
package configs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/cryo-runtime/cryo/snapshot"
)

// RuntimeType is containerd's name for cryo (runtime_type in its config,
// ctr run --runtime): containerd runs containerd-shim-cryo-v2 for it, and
// snapshots record it as their source.
const RuntimeType = "io.containerd.cryo.v2"

// DefaultPath is where the shim and cryoctl look for the node configuration.
const DefaultPath = "/etc/cryo/config.toml"

// Config is the node configuration.
type Config struct {
	Hypervisor  Hypervisor  `toml:"hypervisor"`
	Agent       Agent       `toml:"agent"`
	Runtime     Runtime     `toml:"runtime"`
	Snapshot    Snapshot    `toml:"snapshot"`
	Stores      Stores      `toml:"stores"`
	Restore     Restore     `toml:"restore"`
	Memory      Memory      `toml:"memory"`
	Annotations Annotations `toml:"annotations"`
}

// Memory configures how guest RAM is held.
type Memory struct {
	// Booted is how a booted (not restored) sandbox's RAM is held:
	// BootedOwned, a tmpfs file a checkpoint copies in its pause, or
	// BootedServed, a pagefs file served from zeros whose checkpoint seals
	// the pages the guest wrote, as a lazy restore's
	// (docs/design/constant-time-pause.md).
	Booted string `toml:"booted"`
	// Clones is how a restored sandbox's RAM is held: ClonesPrivate, its
	// own (served page by page, or materialized and copied, by
	// [restore] mode), or ClonesShared, a private mapping of the node's
	// base of its snapshot, which every clone of the snapshot on the node
	// maps, so that they hold one copy of the pages none of them wrote
	// (docs/design/constant-time-pause.md, "Shared clones").
	Clones string `toml:"clones"`
}

// How a booted sandbox's RAM is held (Memory.Booted).
const (
	BootedOwned  = "owned"
	BootedServed = "served"
)

// How a restored sandbox's RAM is held (Memory.Clones).
const (
	ClonesPrivate = "private"
	ClonesShared  = "shared"
)

// Hypervisor configures QEMU and the guest image.
type Hypervisor struct {
	Path         string `toml:"path"`
	Kernel       string `toml:"kernel"`
	Initrd       string `toml:"initrd"`
	KernelArgs   string `toml:"kernel_params"`
	MachineType  string `toml:"machine_type"`
	CPUModel     string `toml:"cpu_model"`
	Accel        string `toml:"accel"`
	VCPUs        int    `toml:"default_vcpus"`
	MemoryMiB    int    `toml:"default_memory"`
	MaxVCPUs     int    `toml:"max_vcpus"`
	MaxMemoryMiB int    `toml:"max_memory"`
	// MemoryDir is the tmpfs directory that holds guest RAM files.
	MemoryDir string `toml:"memory_dir"`
	// HotplugPorts is how many PCIe root ports are created for disks added
	// after boot (containers of a pod created after the sandbox).
	HotplugPorts int `toml:"hotplug_ports"`
	// ConfineQEMU runs QEMU under its seccomp sandbox as an unprivileged
	// uid of its own. Only an explicit false turns it off.
	ConfineQEMU bool `toml:"confine_qemu"`
	// QEMUUIDBase and QEMUUIDCount are the uids (and gids) confined QEMUs
	// run as, one per running sandbox; no passwd entries are needed, but no
	// other user of the host may use them.
	QEMUUIDBase  int `toml:"qemu_uid_base"`
	QEMUUIDCount int `toml:"qemu_uid_count"`
	// ConsoleLogKiB caps each sandbox's guest console log.
	ConsoleLogKiB int `toml:"console_log_size"`
}

// Agent configures the host side of the guest agent channel.
type Agent struct {
	DialTimeout    Duration `toml:"dial_timeout"`
	RequestTimeout Duration `toml:"request_timeout"`
}

// Runtime configures the shim itself.
type Runtime struct {
	// StateRoot holds per-sandbox state (sockets, logs, pid files). Unix
	// socket paths are limited to 108 bytes, so keep it short.
	StateRoot string `toml:"state_root"`
	// ImageCache holds the read-only ext4 base images built from overlayfs
	// layer chains, shared by all sandboxes of the node.
	ImageCache string `toml:"image_cache"`
	// DiskRoot holds the sandboxes' writable disks (qcow2 overlays). It is
	// on disk: bundles and StateRoot are usually tmpfs.
	DiskRoot string `toml:"disk_root"`
	// WritableDiskMiB is the minimum size of a container's writable disk.
	WritableDiskMiB int `toml:"writable_disk_size"`
}

// Snapshot configures the snapshot format.
type Snapshot struct {
	ChunkSizeMiB     int    `toml:"chunk_size"`
	CompressionLevel int    `toml:"compression_level"`
	SigningKey       string `toml:"signing_key"`
	VerifyKey        string `toml:"verify_key"`
	// RequireSignature is unset (nil) unless the file says it: unset, a
	// configured VerifyKey requires signatures (see SignatureRequired).
	RequireSignature *bool  `toml:"require_signature"`
	EncryptionKey    string `toml:"encryption_key"`
	// EncryptionKeyDir holds one key file per namespace, named by the
	// namespace: a sandbox encrypts with and decrypts with its own
	// namespace's key only (see snapshot.LoadNamespaceKey).
	EncryptionKeyDir string `toml:"encryption_key_dir"`
	// LegacyNodeKey lets the node key itself decrypt snapshots that an
	// older cryo sealed with it (before each namespace's key was derived
	// from it): any namespace could restore those, so they are refused
	// unless this is set (default false).
	LegacyNodeKey bool `toml:"legacy_node_key"`
	// RequireEncryption is unset (nil) unless the file says it: unset, a
	// configured key requires encryption (see EncryptionRequired).
	RequireEncryption *bool  `toml:"require_encryption"`
	CacheDir          string `toml:"cache_dir"`
	CacheMaxMiB       int64  `toml:"cache_size"`
	// LocalRoot resolves io.katacontainers.restore-from names; it may hold
	// NamespacePlaceholder as a path element.
	LocalRoot string `toml:"local_root"`
}

// SignatureRequired: as require_signature says, else whenever a verify key
// is configured. A node that names a key has said whom it trusts; taking
// unsigned snapshots anyway would make the key decorative.
func (s Snapshot) SignatureRequired() bool {
	if s.RequireSignature != nil {
		return *s.RequireSignature
	}
	return s.VerifyKey != ""
}

// EncryptionRequired: as require_encryption says, else whenever an
// encryption key or key directory is configured.
func (s Snapshot) EncryptionRequired() bool {
	if s.RequireEncryption != nil {
		return *s.RequireEncryption
	}
	return s.EncryptionKey != "" || s.EncryptionKeyDir != ""
}

// Stores configures where snapshots may come from and go to.
type Stores struct {
	// Allowed lists URL prefixes a restore or checkpoint may name, such as
	// "file:///var/lib/cryo/store/{namespace}/", "s3://snapshots/{namespace}/",
	// "oci://127.0.0.1:5000/templates/". An entry with NamespacePlaceholder
	// admits only the sandbox's own namespace there; one without admits
	// every sandbox of the node (see Stores.Allows).
	Allowed              []string `toml:"allowed"`
	DefaultCheckpointTo  string   `toml:"default_checkpoint_to"`
	MaxConcurrentFetches int      `toml:"max_concurrent_fetches"`
	// DownloadDeadline and MinDownloadRateKiB bound every download of a
	// blob into the node cache to DownloadDeadline + size /
	// MinDownloadRateKiB (and a materialization to the same over the
	// snapshot's size): a store that trickles bytes is cut, whoever waits
	// for it (defaults 60s and 256 KiB/s).
	DownloadDeadline   Duration `toml:"download_deadline"`
	MinDownloadRateKiB int      `toml:"min_download_rate_kib"`
	S3                 S3       `toml:"s3"`
	Registry           Registry `toml:"registry"`
}

// S3 holds S3 / MinIO credentials; empty fields fall back to STORAGE_S3_*.
type S3 struct {
	Endpoint  string `toml:"endpoint"`
	AccessKey string `toml:"access_key"`
	SecretKey string `toml:"secret_key"`
	Region    string `toml:"region"`
	UseSSL    bool   `toml:"use_ssl"`
}

// Registry holds OCI registry settings.
type Registry struct {
	PlainHTTP []string `toml:"plain_http"`
	Username  string   `toml:"username"`
	Password  string   `toml:"password"`
}

// Restore configures restore behaviour.
type Restore struct {
	// Fallback is "fail" or "cold".
	Fallback string `toml:"fallback"`
	// Mode is how a restore gets the snapshot's RAM: "eager" downloads and
	// materializes the whole snapshot before QEMU starts; "lazy" starts
	// QEMU once the metadata and device state are verified and serves RAM
	// page by page (pagefs). Default lazy: the bench finds it no slower
	// than eager for an idle guest and several times faster for a large
	// one (README, Performance).
	Mode string `toml:"mode"`
	// AllowedModes are the modes a pod may ask for with
	// cryo.dev/restore-mode. Eager is always allowed (it needs nothing of
	// the node that a restore does not); lazy only when listed here or
	// when it is the node's Mode, since it mounts a FUSE server per
	// sandbox and keeps the sandbox depending on the store until its
	// prefetch completes.
	AllowedModes []string `toml:"allowed_modes"`
	// PrefetchWorkers bounds a lazy restore's background fetches (4). 0
	// turns the prefetch off: the sandbox then depends on the store (and
	// the node cache keeping its chunks) for as long as it runs.
	PrefetchWorkers int `toml:"prefetch_workers"`
	// PageTimeout bounds one page read of a lazy sandbox (its chunk's
	// fetch from the store); a read stuck longer kills the VM rather than
	// leave it hanging (30s).
	PageTimeout Duration `toml:"page_timeout"`
	// MaxDiskSizeMiB bounds the size a snapshot may give a disk this node
	// restores or serves (65536, at least runtime.writable_disk_size): a
	// restore refuses a larger one when it opens the snapshot, before
	// anything is allocated for it.
	MaxDiskSizeMiB int64 `toml:"max_disk_size"`
	// MaxDeviceStateMiB bounds a lazy restore's device state (64, at most
	// 1024), which holds no RAM: it is written to the sandbox's state
	// directory before QEMU starts.
	MaxDeviceStateMiB int64 `toml:"max_device_state"`
}

// Restore modes.
const (
	RestoreEager = "eager"
	RestoreLazy  = "lazy"
)

// Allows reports whether a pod may ask for restore mode m.
func (r Restore) Allows(m string) bool {
	switch m {
	case RestoreEager:
		return true
	case RestoreLazy:
		return r.Mode == RestoreLazy || slices.Contains(r.AllowedModes, RestoreLazy)
	}
	return false
}

// Annotations configures which pod annotations the shim honours.
type Annotations struct {
	// Enabled lists the cryo.dev/ annotations a pod may set; the rest are
	// refused.
	Enabled []string `toml:"enabled"`
}

// Duration is a time.Duration that reads "5s" from TOML.
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Default returns the built-in configuration: Debian's qemu-system-x86 with
// the guest image that `make guest` installs.
func Default() Config {
	return Config{
		Hypervisor: Hypervisor{
			Path:          "qemu-system-x86_64",
			Kernel:        "/usr/share/cryo/vmlinuz",
			Initrd:        "/usr/share/cryo/initrd.img",
			MachineType:   "pc-q35-7.2",
			CPUModel:      "qemu64",
			Accel:         "tcg",
			VCPUs:         1,
			MemoryMiB:     512,
			MaxVCPUs:      8,
			MaxMemoryMiB:  16384,
			MemoryDir:     "/dev/shm",
			HotplugPorts:  8,
			ConfineQEMU:   true,
			QEMUUIDBase:   1_500_000,
			QEMUUIDCount:  4096,
			ConsoleLogKiB: 1024,
		},
		Agent: Agent{
			DialTimeout:    Duration{60 * time.Second},
			RequestTimeout: Duration{30 * time.Second},
		},
		Runtime: Runtime{
			StateRoot:       "/run/cryo",
			ImageCache:      "/var/lib/cryo/images",
			DiskRoot:        "/var/lib/cryo/disks",
			WritableDiskMiB: 1024,
		},
		Snapshot: Snapshot{
			ChunkSizeMiB:     snapshot.DefaultChunkSize >> 20,
			CompressionLevel: 1,
			CacheDir:         "/var/lib/cryo/cache",
			CacheMaxMiB:      20480,
			LocalRoot:        "/var/lib/cryo/store/" + NamespacePlaceholder,
		},
		Stores: Stores{
			Allowed:              []string{"file:///var/lib/cryo/store/" + NamespacePlaceholder + "/"},
			MaxConcurrentFetches: 8,
			DownloadDeadline:     Duration{60 * time.Second},
			MinDownloadRateKiB:   256,
		},
		Memory: Memory{Booted: BootedOwned, Clones: ClonesPrivate},
		Restore: Restore{Fallback: "fail", Mode: RestoreLazy, PrefetchWorkers: 4, PageTimeout: Duration{30 * time.Second},
			MaxDiskSizeMiB: 65536, MaxDeviceStateMiB: 64},
		Annotations: Annotations{Enabled: []string{"cryo.dev/*"}},
	}
}

// Load reads path over the defaults and validates the result. A missing
// file at DefaultPath yields the defaults; a missing file named explicitly is
// an error.
func Load(path string) (Config, error) {
	cfg := Default()
	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := Decode(b, &cfg); err != nil {
			return cfg, fmt.Errorf("config %s: %w", path, err)
		}
	case errors.Is(err, os.ErrNotExist) && !explicit:
	default:
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Decode reads TOML over cfg, refusing unknown keys so a typo is an error
// rather than a silently ignored setting.
func Decode(b []byte, cfg *Config) error {
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return fmt.Errorf("unknown setting: %s", strings.TrimSpace(sm.String()))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return fmt.Errorf("line %d column %d: %s", row, col, de.Error())
		}
		return err
	}
	return nil
}

var versionedMachine = regexp.MustCompile(`^pc-(q35|i440fx)-[0-9]+\.[0-9]+$`)

// Validate checks every value and names the first bad one.
func (c *Config) Validate() error {
	h := c.Hypervisor
	switch {
	case h.Path == "":
		return errors.New("hypervisor.path is empty")
	case !filepath.IsAbs(h.Kernel):
		return fmt.Errorf("hypervisor.kernel %q: must be an absolute path", h.Kernel)
	case !filepath.IsAbs(h.Initrd):
		return fmt.Errorf("hypervisor.initrd %q: must be an absolute path", h.Initrd)
	case !versionedMachine.MatchString(h.MachineType):
		return fmt.Errorf("hypervisor.machine_type %q: must be a versioned machine type such as pc-q35-7.2 (an alias like q35 changes meaning between QEMU versions and breaks restore)", h.MachineType)
	case h.CPUModel == "":
		return errors.New("hypervisor.cpu_model is empty: name a CPU model (qemu64, host, ...)")
	case h.Accel != "tcg" && h.Accel != "kvm":
		return fmt.Errorf("hypervisor.accel %q: must be tcg or kvm", h.Accel)
	case h.VCPUs < 1 || h.VCPUs > h.MaxVCPUs:
		return fmt.Errorf("hypervisor.default_vcpus %d: must be between 1 and max_vcpus (%d)", h.VCPUs, h.MaxVCPUs)
	case h.MemoryMiB < 128 || h.MemoryMiB > h.MaxMemoryMiB:
		return fmt.Errorf("hypervisor.default_memory %d MiB: must be between 128 and max_memory (%d)", h.MemoryMiB, h.MaxMemoryMiB)
	case h.HotplugPorts < 0 || h.HotplugPorts > 16:
		return fmt.Errorf("hypervisor.hotplug_ports %d: must be between 0 and 16", h.HotplugPorts)
	case !filepath.IsAbs(h.MemoryDir):
		return fmt.Errorf("hypervisor.memory_dir %q: must be an absolute path", h.MemoryDir)
	case h.QEMUUIDBase < 1 || h.QEMUUIDCount < 1 || int64(h.QEMUUIDBase)+int64(h.QEMUUIDCount) > 1<<31:
		return fmt.Errorf("hypervisor.qemu_uid_base %d, qemu_uid_count %d: must be a range of positive uids below 2^31", h.QEMUUIDBase, h.QEMUUIDCount)
	case h.ConsoleLogKiB < 4:
		return fmt.Errorf("hypervisor.console_log_size %d KiB: must be at least 4", h.ConsoleLogKiB)
	}
	if c.Agent.DialTimeout.Duration <= 0 || c.Agent.RequestTimeout.Duration <= 0 {
		return errors.New("agent timeouts must be positive")
	}
	if !filepath.IsAbs(c.Runtime.StateRoot) || len(c.Runtime.StateRoot) > 40 {
		return fmt.Errorf("runtime.state_root %q: must be an absolute path of at most 40 bytes (unix socket paths are limited to 108)", c.Runtime.StateRoot)
	}
	if !filepath.IsAbs(c.Runtime.ImageCache) {
		return fmt.Errorf("runtime.image_cache %q: must be an absolute path", c.Runtime.ImageCache)
	}
	if !filepath.IsAbs(c.Runtime.DiskRoot) {
		return fmt.Errorf("runtime.disk_root %q: must be an absolute path", c.Runtime.DiskRoot)
	}
	if c.Runtime.WritableDiskMiB < 64 {
		return fmt.Errorf("runtime.writable_disk_size %d MiB: must be at least 64", c.Runtime.WritableDiskMiB)
	}
	s := c.Snapshot
	switch {
	case s.ChunkSizeMiB < 1 || s.ChunkSizeMiB > 64:
		return fmt.Errorf("snapshot.chunk_size %d MiB: must be between 1 and 64", s.ChunkSizeMiB)
	case s.CompressionLevel < 1 || s.CompressionLevel > 22:
		return fmt.Errorf("snapshot.compression_level %d: must be a zstd level between 1 (fastest) and 22", s.CompressionLevel)
	case !filepath.IsAbs(s.CacheDir):
		return fmt.Errorf("snapshot.cache_dir %q: must be an absolute path", s.CacheDir)
	case s.LocalRoot != "" && !filepath.IsAbs(s.LocalRoot):
		return fmt.Errorf("snapshot.local_root %q: must be an absolute path", s.LocalRoot)
	case strings.Contains(s.LocalRoot, NamespacePlaceholder) && !strings.Contains(s.LocalRoot, "/"+NamespacePlaceholder+"/") && !strings.HasSuffix(s.LocalRoot, "/"+NamespacePlaceholder):
		return fmt.Errorf("snapshot.local_root %q: %s must be a whole path element", s.LocalRoot, NamespacePlaceholder)
	case s.EncryptionKeyDir != "" && !filepath.IsAbs(s.EncryptionKeyDir):
		return fmt.Errorf("snapshot.encryption_key_dir %q: must be an absolute path", s.EncryptionKeyDir)
	case s.EncryptionKeyDir != "" && s.EncryptionKey != "":
		return errors.New("snapshot.encryption_key and snapshot.encryption_key_dir are both set: with a key per namespace, one node key would open every tenant's snapshots")
	case s.RequireSignature != nil && *s.RequireSignature && s.VerifyKey == "":
		return errors.New("snapshot.require_signature is set but snapshot.verify_key is not")
	case s.RequireEncryption != nil && *s.RequireEncryption && s.EncryptionKey == "" && s.EncryptionKeyDir == "":
		return errors.New("snapshot.require_encryption is set but neither snapshot.encryption_key nor snapshot.encryption_key_dir is")
	}
	if err := validateAllowed(c.Stores.Allowed); err != nil {
		return err
	}
	if c.Stores.MaxConcurrentFetches < 1 {
		return fmt.Errorf("stores.max_concurrent_fetches %d: must be at least 1", c.Stores.MaxConcurrentFetches)
	}
	if d := c.Stores.DownloadDeadline.Duration; d < time.Second || d > time.Hour {
		return fmt.Errorf("stores.download_deadline %s: must be in [1s, 1h]", d)
	}
	if r := c.Stores.MinDownloadRateKiB; r < 1 || r > 10<<20 {
		return fmt.Errorf("stores.min_download_rate_kib %d: must be in [1, %d]", r, 10<<20)
	}
	if f := c.Restore.Fallback; f != "fail" && f != "cold" {
		return fmt.Errorf("restore.fallback %q: must be fail or cold", f)
	}
	if b := c.Memory.Booted; b != BootedOwned && b != BootedServed {
		return fmt.Errorf("memory.booted %q: must be %s or %s", b, BootedOwned, BootedServed)
	}
	if v := c.Memory.Clones; v != ClonesPrivate && v != ClonesShared {
		return fmt.Errorf("memory.clones %q: must be %s or %s", v, ClonesPrivate, ClonesShared)
	}
	if c.Restore.MaxDiskSizeMiB < int64(c.Runtime.WritableDiskMiB) || c.Restore.MaxDiskSizeMiB > 4<<20 {
		return fmt.Errorf("restore.max_disk_size %d MiB: must be between runtime.writable_disk_size (%d) and 4194304 (4 TiB)", c.Restore.MaxDiskSizeMiB, c.Runtime.WritableDiskMiB)
	}
	return c.Restore.validate()
}

func (r Restore) validate() error {
	if r.Mode != RestoreEager && r.Mode != RestoreLazy {
		return fmt.Errorf("restore.mode %q: must be eager or lazy", r.Mode)
	}
	for _, m := range r.AllowedModes {
		if m != RestoreEager && m != RestoreLazy {
			return fmt.Errorf("restore.allowed_modes: %q: must be eager or lazy", m)
		}
	}
	if r.PrefetchWorkers < 0 || r.PrefetchWorkers > 64 {
		return fmt.Errorf("restore.prefetch_workers %d: must be in [0, 64]", r.PrefetchWorkers)
	}
	if r.PageTimeout.Duration < time.Second || r.PageTimeout.Duration > 10*time.Minute {
		return fmt.Errorf("restore.page_timeout %s: must be in [1s, 10m]", r.PageTimeout.Duration)
	}
	if r.MaxDeviceStateMiB < 1 || r.MaxDeviceStateMiB > 1024 {
		return fmt.Errorf("restore.max_device_state %d MiB: must be in [1, 1024]", r.MaxDeviceStateMiB)
	}
	return nil
}
