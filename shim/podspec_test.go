package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
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

// TestHostnameNeedsOwnUTSNamespace: as runc, a spec that sets a hostname
// without a UTS namespace (CRI's host-network pod) is refused, naming the
// field; a hostname with its own namespace, or none, is fine.
func TestHostnameNeedsOwnUTSNamespace(t *testing.T) {
	uts := &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.UTSNamespace}}}
	hostNet := &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}}}
	for _, tc := range []struct {
		name string
		spec specs.Spec
		ok   bool
	}{
		{"own uts namespace", specs.Spec{Hostname: "web", Linux: uts}, true},
		{"host network, no hostname", specs.Spec{Linux: hostNet}, true},
		{"host network with hostname", specs.Spec{Hostname: "web", Linux: hostNet}, false},
		{"no linux section", specs.Spec{Hostname: "web"}, false},
	} {
		err := checkHostname(&tc.spec)
		if tc.ok != (err == nil) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err != nil && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "uts namespace") || !strings.Contains(err.Error(), `"web"`)) {
			t.Errorf("%s: error %q does not name the hostname and the uts namespace as an invalid argument", tc.name, err)
		}
	}
}

// TestPodNamespaces: a CRI container joins, in the guest, the IPC and UTS
// namespaces its sandbox container has of its own (a restored one's by its
// guest id); a host-network pod's UTS namespace is the node's, not the
// sandbox container's, so it is not joined (the hostname comes from
// /etc/hostname as before); nothing is joined outside a CRI pod.
func TestPodNamespaces(t *testing.T) {
	own := func(types ...specs.LinuxNamespaceType) *specs.Spec {
		s := &specs.Spec{Linux: &specs.Linux{}}
		for _, ty := range types {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: ty})
		}
		return s
	}
	s := &service{containers: map[string]*container{
		"pod":     {id: "pod", guestID: "old-pod", spec: own(specs.IPCNamespace, specs.UTSNamespace, specs.PIDNamespace)},
		"hostnet": {id: "hostnet", guestID: "hostnet", spec: own(specs.IPCNamespace, specs.PIDNamespace)},
	}}
	ctr := func(sandboxID string) *specs.Spec {
		return &specs.Spec{
			Annotations: map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": sandboxID},
			Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
				{Type: specs.IPCNamespace, Path: "/proc/9/ns/ipc"}, {Type: specs.UTSNamespace, Path: "/proc/9/ns/uts"},
				{Type: specs.PIDNamespace, Path: "/proc/9/ns/pid"},
			}},
		}
	}
	for _, c := range []struct {
		name     string
		spec     *specs.Spec
		from     string
		wantJoin string
	}{
		{"pod", ctr("pod"), "old-pod", "ipc,uts"},
		{"host network", ctr("hostnet"), "hostnet", "ipc"},
		{"unknown sandbox", ctr("nope"), "", ""},
		{"not CRI", &specs.Spec{Linux: ctr("pod").Linux}, "", ""},
	} {
		from, join := s.podNamespaces(c.spec)
		if from != c.from || strings.Join(join, ",") != c.wantJoin {
			t.Errorf("%s: join %v of %q, want %q of %q", c.name, join, from, c.wantJoin, c.from)
		}
	}
}
