package guest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestParseMountOptions(t *testing.T) {
	for _, tc := range []struct {
		opts  []string
		flags uintptr
		data  string
		bind  bool
	}{
		{[]string{"nosuid", "noexec", "nodev", "ro"}, unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV | unix.MS_RDONLY, "", false},
		{[]string{"nosuid", "strictatime", "mode=755", "size=65536k"}, unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k", false},
		{[]string{"rbind", "rprivate", "ro", "rw"}, 0, "", true},
		{[]string{"errors=remount-ro", "noatime"}, unix.MS_NOATIME, "errors=remount-ro", false},
	} {
		flags, data, bind := parseMountOptions(tc.opts)
		if flags != tc.flags || data != tc.data || bind != tc.bind {
			t.Errorf("%v: got %#x %q %v, want %#x %q %v", tc.opts, flags, data, bind, tc.flags, tc.data, tc.bind)
		}
	}
}

func defaultSpec() *specs.Spec {
	umask := uint32(0o22)
	return &specs.Spec{
		Process: &specs.Process{
			Args: []string{"sh"}, Env: []string{"A=1"}, Cwd: "/work",
			User:    specs.User{UID: 1000, GID: 100, AdditionalGids: []uint32{5}, Umask: &umask},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 4096}},
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "h",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/sandbox/shm", Options: []string{"rbind"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/hosts", Options: []string{"rbind", "ro"}},
			{Destination: "/data", Source: "/host/data", Options: []string{"rbind"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro"}},
			{Destination: "/mnt", Type: "nfs", Source: "server:/x"},
		},
		Linux: &specs.Linux{
			Devices:     []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229}},
			MaskedPaths: []string{"/proc/kcore"},
		},
	}
}

func TestTranslateSpec(t *testing.T) {
	files := []fileEntry{{Path: "/etc/hosts", Content: []byte("x")}, {Path: "/data/a/b", Content: []byte("b")}, {Path: "/etc/motd", Content: []byte("m")}}
	cfg, skipped, err := translateSpec(defaultSpec(), "/run/cryo/c/x/rootfs", files)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != helperInit || cfg.Rootfs != "/run/cryo/c/x/rootfs" || !cfg.ReadonlyRoot || cfg.Hostname != "h" {
		t.Errorf("config %+v", cfg)
	}
	var targets []string
	for _, m := range cfg.Mounts {
		targets = append(targets, m.Target+":"+m.FSType)
	}
	want := []string{"/proc:proc", "/dev/shm:tmpfs", "/etc/hosts:", "/data:", "/sys/fs/cgroup:cgroup2"}
	if !reflect.DeepEqual(targets, want) {
		t.Errorf("mounts %v, want %v", targets, want)
	}
	if cfg.Mounts[4].Flags != unix.MS_RDONLY {
		t.Errorf("cgroup mount flags %#x", cfg.Mounts[4].Flags)
	}
	// bind mounts are the host's copies, with the spec's flags: /etc/hosts
	// a read-only file, /data a writable directory.
	hosts, data := cfg.Mounts[2], cfg.Mounts[3]
	if hosts.Copy == nil || !hosts.Copy.File || hosts.Flags != unix.MS_RDONLY || len(hosts.Copy.Files) != 1 || hosts.Copy.Files[0].Path != "" {
		t.Errorf("/etc/hosts mount %+v", hosts)
	}
	if data.Copy == nil || data.Copy.File || data.Flags != 0 || len(data.Copy.Files) != 1 || data.Copy.Files[0].Path != "a/b" {
		t.Errorf("/data mount %+v", data)
	}
	// a file of no mount is written into the root as it is
	if len(cfg.Files) != 1 || cfg.Files[0].Path != "/etc/motd" {
		t.Errorf("files %+v", cfg.Files)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "nfs") {
		t.Errorf("skipped %q", skipped)
	}
	if n := len(cfg.Devices); n != len(defaultDevices)+1 || cfg.Devices[n-1].Path != "/dev/fuse" || cfg.Devices[n-1].Mode != 0o666 {
		t.Errorf("devices %+v", cfg.Devices)
	}
	if !reflect.DeepEqual(cfg.MaskedPaths, []string{"/proc/kcore"}) {
		t.Errorf("masked %v", cfg.MaskedPaths)
	}
}

func TestTranslateProcess(t *testing.T) {
	p, err := translateProcess(defaultSpec().Process)
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != 1000 || p.GID != 100 || !reflect.DeepEqual(p.AdditionalGids, []uint32{5}) || *p.Umask != 0o22 || p.Cwd != "/work" {
		t.Errorf("process %+v", p)
	}
	if !reflect.DeepEqual(p.Rlimits, []rlimit{{unix.RLIMIT_NOFILE, 1024, 4096}}) {
		t.Errorf("rlimits %+v", p.Rlimits)
	}
	if !hasEnv(p.Env, "PATH") || !hasEnv(p.Env, "A") {
		t.Errorf("env %v lacks a default PATH or A", p.Env)
	}
	for name, proc := range map[string]*specs.Process{
		"no args":        {Cwd: "/"},
		"relative cwd":   {Args: []string{"sh"}, Cwd: "tmp"},
		"unknown rlimit": {Args: []string{"sh"}, Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_BOGUS"}}},
	} {
		if _, err := translateProcess(proc); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	p, err = translateProcess(&specs.Process{Args: []string{"x"}, Env: []string{"PATH=/opt"}})
	if err != nil || p.Cwd != "/" || !reflect.DeepEqual(p.Env, []string{"PATH=/opt"}) {
		t.Errorf("defaults: %+v %v", p, err)
	}
}

func TestContainerNamespaces(t *testing.T) {
	base := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC)
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: "network", Path: "/run/netns/x"}, {Type: "pid"}}}}
	if f, err := containerNamespaces(spec, nil); err != nil || f != base {
		t.Errorf("network path: %#x %v", f, err)
	}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: "cgroup"})
	if f, _ := containerNamespaces(spec, nil); f != base|unix.CLONE_NEWCGROUP {
		t.Errorf("cgroup namespace not requested: %#x", f)
	}
	// The pod's ipc and uts namespaces are joined, not made.
	if f, err := containerNamespaces(spec, []string{"ipc", "uts"}); err != nil || f != unix.CLONE_NEWNS|unix.CLONE_NEWPID|unix.CLONE_NEWCGROUP {
		t.Errorf("joining ipc and uts: %#x %v", f, err)
	}
	for _, join := range [][]string{{"pid"}, {"net"}, {"ipc", "ipc"}, {""}} {
		if _, err := containerNamespaces(spec, join); err == nil {
			t.Errorf("joining %q was accepted", join)
		}
	}
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: "ipc", Path: "/proc/1/ns/ipc"}}
	if _, err := containerNamespaces(spec, nil); err == nil {
		t.Error("joining an ipc namespace by path was accepted")
	}
}

func TestSysctlPaths(t *testing.T) {
	got, err := sysctlPaths(map[string]string{
		"kernel.shm_rmid_forced":            "1",
		"net.ipv4.ip_local_port_range":      "1024 65000",
		"net/ipv4/conf/eth0.100/forwarding": "1",
	})
	want := map[string]string{
		"kernel/shm_rmid_forced":            "1",
		"net/ipv4/ip_local_port_range":      "1024 65000",
		"net/ipv4/conf/eth0.100/forwarding": "1",
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("sysctlPaths = %v, %v; want %v", got, err, want)
	}
	for _, key := range []string{"", "kernel..shm", "net/../../etc/passwd", "/kernel/x", "kernel/", "..", "a\x00b"} {
		if _, err := sysctlPaths(map[string]string{key: "1"}); err == nil || !strings.Contains(err.Error(), "linux.sysctl") {
			t.Errorf("key %q: %v, want a refusal naming linux.sysctl", key, err)
		}
	}
	cfg, _, err := translateSpec(&specs.Spec{Process: &specs.Process{Args: []string{"x"}}, Linux: &specs.Linux{Sysctl: map[string]string{"../x": "1"}}}, "/r", nil)
	if err == nil || cfg != nil {
		t.Errorf("translateSpec with sysctl ../x: %v", err)
	}
}

func TestCapMask(t *testing.T) {
	m, err := capMask([]string{"CAP_CHOWN", "CAP_KILL", "CAP_CHECKPOINT_RESTORE"})
	if err != nil || m != 1|1<<5|1<<40 {
		t.Errorf("mask %#x %v", m, err)
	}
	if _, err := capMask([]string{"CAP_NOPE"}); err == nil {
		t.Error("unknown capability accepted")
	}
}

// TestBindOptions: the spec's options of a bind mount become the remount's
// flags; an option a bind mount cannot honour fails the mount, naming it.
func TestBindOptions(t *testing.T) {
	for _, tc := range []struct {
		opts  []string
		flags uintptr
		err   string
	}{
		{[]string{"rbind", "rprivate", "ro"}, unix.MS_RDONLY, ""},
		{[]string{"bind", "ro", "nosuid", "nodev", "noexec"}, unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{[]string{"rbind", "rro", "rnosuid"}, unix.MS_RDONLY | unix.MS_NOSUID, ""},
		{[]string{"rbind", "ro", "rw", "rslave"}, 0, ""},
		{[]string{"rbind", "ro", "rrw"}, 0, ""},
		{[]string{"rbind", "noatime", "relatime"}, unix.MS_NOATIME | unix.MS_RELATIME, ""},
		{[]string{"rbind", "remount"}, 0, `"remount"`},
		{[]string{"rbind", "size=1m"}, 0, `"size=1m"`},
		{[]string{"rbind", "idmap"}, 0, `"idmap"`},
		{[]string{"rbind", "rsync"}, 0, `"rsync"`},
	} {
		flags, err := bindFlags(tc.opts)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want one naming %s", tc.opts, err, tc.err)
			}
			continue
		}
		if err != nil || flags != tc.flags {
			t.Errorf("%v: got %#x %v, want %#x", tc.opts, flags, err, tc.flags)
		}
	}
	s := defaultSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/x", Type: "bind", Source: "/y", Options: []string{"rbind", "exotic"}})
	if _, _, err := translateSpec(s, "/r", nil); err == nil || !strings.Contains(err.Error(), "mounts[6] (/x)") {
		t.Errorf("translateSpec of a bad bind option: %v", err)
	}
	s.Mounts[6] = specs.Mount{Destination: "/", Type: "bind", Source: "/y"}
	if _, _, err := translateSpec(s, "/r", nil); err == nil {
		t.Error("a bind mount onto / was accepted")
	}
}

// TestAssignCopies: nested copied mounts each get their own files, the
// longest target winning, as with the service-account token inside a
// secrets directory.
func TestAssignCopies(t *testing.T) {
	mounts := []mountEntry{
		{Target: "/proc", FSType: "proc"},
		{Target: "/run/secrets", Copy: &copiedMount{}},
		{Target: "/run/secrets/sa", Copy: &copiedMount{}},
		{Target: "/run/secretsx", Copy: &copiedMount{}},
	}
	rest := assignCopies(mounts, []fileEntry{
		{Path: "/run/secrets/a"}, {Path: "/run/secrets/sa/token"}, {Path: "/run/secretsx"}, {Path: "/proc/x"},
	})
	paths := func(fs []fileEntry) (ps []string) {
		for _, f := range fs {
			ps = append(ps, f.Path)
		}
		return ps
	}
	if got := paths(mounts[1].Copy.Files); !reflect.DeepEqual(got, []string{"a"}) || mounts[1].Copy.File {
		t.Errorf("/run/secrets: %v", got)
	}
	if got := paths(mounts[2].Copy.Files); !reflect.DeepEqual(got, []string{"token"}) {
		t.Errorf("/run/secrets/sa: %v", got)
	}
	if !mounts[3].Copy.File || len(mounts[3].Copy.Files) != 1 {
		t.Errorf("/run/secretsx: %+v", mounts[3].Copy)
	}
	if got := paths(rest); !reflect.DeepEqual(got, []string{"/proc/x"}) {
		t.Errorf("unclaimed %v", got)
	}
}

// TestUnsentMounts: a bind mount with no files is an empty directory the
// host copied, unless its target in the root is a file: then the host sent
// nothing for it and it is skipped, as a bind mount of a host path.
func TestUnsentMounts(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "hosts"), []byte("x"), 0o644)
	s := defaultSpec()
	s.Mounts = []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: "/h", Options: []string{"rbind", "ro"}},
		{Destination: "/empty", Type: "bind", Source: "/e", Options: []string{"rbind"}},
	}
	cfg, skipped, err := translateSpec(s, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Mounts) != 1 || cfg.Mounts[0].Target != "/empty" || cfg.Mounts[0].Copy == nil {
		t.Errorf("mounts %+v", cfg.Mounts)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "/etc/hosts") {
		t.Errorf("skipped %q", skipped)
	}
}
