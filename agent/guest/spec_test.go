package guest

import (
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
	files := []fileEntry{{Path: "/etc/hosts", Content: []byte("x")}}
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
	want := []string{"/proc:proc", "/dev/shm:tmpfs", "/sys/fs/cgroup:cgroup2"}
	if !reflect.DeepEqual(targets, want) {
		t.Errorf("mounts %v, want %v", targets, want)
	}
	if cfg.Mounts[2].Flags != unix.MS_RDONLY {
		t.Errorf("cgroup mount flags %#x", cfg.Mounts[2].Flags)
	}
	// /etc/hosts is satisfied by the copied file; /data and nfs cannot be done.
	if len(skipped) != 2 || !strings.Contains(skipped[0], "/data") || !strings.Contains(skipped[1], "nfs") {
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
	if f, err := containerNamespaces(spec); err != nil || f != base {
		t.Errorf("network path: %#x %v", f, err)
	}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: "cgroup"})
	if f, _ := containerNamespaces(spec); f != base|unix.CLONE_NEWCGROUP {
		t.Errorf("cgroup namespace not requested: %#x", f)
	}
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: "ipc", Path: "/proc/1/ns/ipc"}}
	if _, err := containerNamespaces(spec); err == nil {
		t.Error("joining an ipc namespace by path was accepted")
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
