package shim

import (
	"fmt"
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
		pid      string
	}{
		{"pod", ctr("pod"), "old-pod", "ipc,uts", "old-pod"},
		{"host network", ctr("hostnet"), "hostnet", "ipc", "hostnet"},
		{"unknown sandbox", ctr("nope"), "", "", ""},
		{"not CRI", &specs.Spec{Linux: ctr("pod").Linux}, "", "", ""},
	} {
		j := s.podNamespaces(c.spec)
		if j.from != c.from || strings.Join(j.namespaces, ",") != c.wantJoin || j.pid != c.pid {
			t.Errorf("%s: join %v of %q and the pid namespace of %q, want %q of %q and %q", c.name, j.namespaces, j.from, j.pid, c.wantJoin, c.from, c.pid)
		}
	}
}

// TestPidNamespaceOfPod: a container that names a pid namespace joins the
// sandbox container's in a pod whose containers all name it
// (shareProcessNamespace), and otherwise the pod's first running
// container's (kubectl debug --target): CRI names both by the VM's pid.
func TestPidNamespaceOfPod(t *testing.T) {
	app := func(sandboxID string, seq uint64, sharesPid bool, st procState) *container {
		return &container{
			id: fmt.Sprintf("app%d", seq), guestID: fmt.Sprintf("guest-app%d", seq), seq: seq, sharesPid: sharesPid,
			spec: &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": sandboxID}},
			init: &process{state: st},
		}
	}
	pod := &container{id: "pod", guestID: "guest-pod", spec: &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}}
	for _, tc := range []struct {
		name string
		apps []*container
		want string
	}{
		{"first container of a pod", nil, "guest-pod"},
		{"shared pod", []*container{app("pod", 1, true, stateRunning), app("pod", 2, true, stateRunning)}, "guest-pod"},
		{"debug container", []*container{app("pod", 3, false, stateRunning), app("pod", 2, false, stateRunning), app("pod", 1, false, stateStopped)}, "guest-app2"},
		{"debug container, nothing runs", []*container{app("pod", 1, false, stateStopped)}, ""},
		{"another pod's containers", []*container{app("other", 1, false, stateRunning)}, "guest-pod"},
	} {
		s := &service{containers: map[string]*container{"pod": pod}}
		for _, c := range tc.apps {
			s.containers[c.id] = c
		}
		if got := s.pidNamespace(pod); got != tc.want {
			t.Errorf("%s: the pid namespace of %q, want %q", tc.name, got, tc.want)
		}
	}
}
