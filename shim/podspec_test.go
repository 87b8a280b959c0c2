package shim

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestDropHostNamespacePaths(t *testing.T) {
	hn := filepath.Join(t.TempDir(), "hostname")
	if err := os.WriteFile(hn, []byte("mypod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &specs.Spec{
		Mounts: []specs.Mount{{Destination: "/etc/hostname", Source: hn, Type: "bind"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"},
			{Type: specs.IPCNamespace, Path: "/proc/42/ns/ipc"},
			{Type: specs.UTSNamespace, Path: "/proc/42/ns/uts"},
			{Type: specs.PIDNamespace},
			{Type: specs.MountNamespace},
		}},
	}
	dropHostNamespacePaths(s)
	if got := podNetNS(s); got != "/var/run/netns/cni-1" {
		t.Fatalf("netns path = %q, want kept", got)
	}
	for _, ns := range s.Linux.Namespaces[1:] {
		if ns.Path != "" {
			t.Fatalf("%s namespace path %q kept", ns.Type, ns.Path)
		}
	}
	if s.Hostname != "mypod" {
		t.Fatalf("hostname = %q, want the pod's from /etc/hostname", s.Hostname)
	}
	// a sandbox container (no paths) is unchanged
	s2 := &specs.Spec{Hostname: "h", Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace}}}}
	dropHostNamespacePaths(s2)
	if s2.Hostname != "h" || podNetNS(s2) != "" {
		t.Fatalf("sandbox spec changed: %+v", s2)
	}
}

func podNetNS(s *specs.Spec) string {
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}
