package shim

import (
	"fmt"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/annotations"
)

// checkHostname refuses a spec that sets a hostname without a UTS namespace
// of its own, as runc does ("unable to set hostname without a private UTS
// namespace"). CRI leaves the UTS namespace out for a host-network pod:
// such a pod shares the node's hostname and cannot set its own. The VM
// could set it anyway, but a pod must not run under cryo that runc
// refuses.
func checkHostname(spec *specs.Spec) error {
	if spec.Hostname == "" {
		return nil
	}
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.UTSNamespace {
				return nil
			}
		}
	}
	return fmt.Errorf("spec sets hostname %q but linux.namespaces has no uts namespace (a host-network pod cannot set its own hostname): %w", spec.Hostname, errdefs.ErrInvalidArgument)
}

// podJoin is what a CRI container takes from other containers of its pod
// in the guest. CRI has a container join the sandbox container's IPC and
// UTS namespaces, and in a pod that shares its process namespace its PID
// namespace, by host paths (/proc/<pid>/ns/...); the guest agent joins
// those containers' own instead.
type podJoin struct {
	from       string   // the sandbox container's guest id
	namespaces []string // taken from it: "ipc", "uts"
	pid        string   // the guest id of the container whose pid namespace it is made in
}

// podNamespaces is what a CRI container joins. Only namespaces the sandbox
// container has of its own: a host-network pod's containers name the
// node's UTS namespace, whose hostname the guest takes from the
// /etc/hostname CRI mounts (dropHostNamespacePaths). Nothing is shared
// with a sandbox container this shim does not run.
func (s *service) podNamespaces(spec *specs.Spec) podJoin {
	if spec.Linux == nil || spec.Annotations[annotations.CRIContainerType] != "container" {
		return podJoin{}
	}
	sb, err := s.container(spec.Annotations[annotations.CRISandboxID])
	if err != nil || sb.spec.Linux == nil {
		return podJoin{}
	}
	var j podJoin
	for _, ns := range spec.Linux.Namespaces {
		if ns.Path != "" && (ns.Type == specs.IPCNamespace || ns.Type == specs.UTSNamespace) && hasOwnNamespace(sb.spec, ns.Type) {
			j.namespaces = append(j.namespaces, string(ns.Type))
		}
	}
	if len(j.namespaces) > 0 {
		j.from = sb.guestID
	}
	if namesNamespace(spec, specs.PIDNamespace) && hasOwnNamespace(sb.spec, specs.PIDNamespace) {
		j.pid = s.pidNamespace(sb)
	}
	return j
}

// pidNamespace is the guest container whose pid namespace a CRI container
// of sandbox sb joins. CRI names it by a host pid: the sandbox's for a pod
// that shares its process namespace (shareProcessNamespace), the target's
// for a debug container (kubectl debug --target), and under cryo both are
// the VM's. The pod's other containers tell the two apart: in a pod that
// shares, every container names one; a container that named none means the
// pod does not, and this one targets another: the pod's first that runs
// (the target's name does not reach the runtime; docs/kubernetes.md).
func (s *service) pidNamespace(sb *container) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	shared := true
	var target *container
	for _, c := range s.containers {
		if c.sharesPid || c.spec.Annotations[annotations.CRIContainerType] != "container" ||
			c.spec.Annotations[annotations.CRISandboxID] != sb.id {
			continue
		}
		shared = false
		if c.init.current() == stateRunning && (target == nil || c.seq < target.seq) {
			target = c
		}
	}
	switch {
	case shared:
		return sb.guestID
	case target != nil:
		return target.guestID
	}
	return ""
}

// namesNamespace: spec joins a namespace of type t by path.
func namesNamespace(spec *specs.Spec, t specs.LinuxNamespaceType) bool {
	if spec.Linux == nil {
		return false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == t && ns.Path != "" {
			return true
		}
	}
	return false
}

// dropHostNamespacePaths makes a CRI container's spec runnable in the guest.
// CRI has a pod's containers join the sandbox container's IPC, UTS and PID
// namespaces by host paths (/proc/<pid>/ns/...), which name nothing in the
// VM: the guest agent joins the containers' own there (podNamespaces), or
// an older agent makes new ones (the VM is the pod's isolation boundary).
// The network namespace path is kept: it is the pod netns on the host that
// setupNetwork bridges, and the guest ignores it.
// A container that joined the sandbox's UTS namespace gets the pod's
// hostname from the /etc/hostname file CRI mounts (an agent that joins the
// sandbox container's UTS namespace keeps the pod's instead; an older one,
// in a restored guest, makes a new namespace).
func dropHostNamespacePaths(spec *specs.Spec) {
	if spec.Linux == nil {
		return
	}
	for i, ns := range spec.Linux.Namespaces {
		if ns.Path == "" || ns.Type == specs.NetworkNamespace {
			continue
		}
		spec.Linux.Namespaces[i].Path = ""
		if ns.Type == specs.UTSNamespace && spec.Hostname == "" {
			spec.Hostname = mountedHostname(spec)
		}
	}
}

func mountedHostname(spec *specs.Spec) string {
	for _, m := range spec.Mounts {
		if m.Destination != "/etc/hostname" {
			continue
		}
		b, _, err := readRegular(m.Source, func(flag int) (*os.File, error) { return os.OpenFile(m.Source, flag, 0) }, 256)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	return ""
}

// hasOwnNamespace: spec asks for a new namespace of type t.
func hasOwnNamespace(spec *specs.Spec, t specs.LinuxNamespaceType) bool {
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == t && ns.Path == "" {
			return true
		}
	}
	return false
}
