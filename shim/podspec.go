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

// podNamespaces are the namespaces a CRI container shares with its pod's
// sandbox container, and that container's id in the guest. CRI has a
// container join the sandbox container's IPC and UTS namespaces by host
// paths (/proc/<pid>/ns/...); the guest agent joins the sandbox container's
// own instead. Only those the sandbox container has of its own: a
// host-network pod's containers name the node's UTS namespace, whose
// hostname the guest takes from the /etc/hostname CRI mounts
// (dropHostNamespacePaths). The pid namespace is not joined (see the
// agent's joinable). Nothing is shared with a sandbox container this shim
// does not run.
func (s *service) podNamespaces(spec *specs.Spec) (from string, join []string) {
	if spec.Linux == nil || spec.Annotations[annotations.CRIContainerType] != "container" {
		return "", nil
	}
	sb, err := s.container(spec.Annotations[annotations.CRISandboxID])
	if err != nil || sb.spec.Linux == nil {
		return "", nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Path != "" && (ns.Type == specs.IPCNamespace || ns.Type == specs.UTSNamespace) && hasOwnNamespace(sb.spec, ns.Type) {
			join = append(join, string(ns.Type))
		}
	}
	if len(join) == 0 {
		return "", nil
	}
	return sb.guestID, join
}

// dropHostNamespacePaths makes a CRI container's spec runnable in the guest.
// CRI has a pod's containers join the sandbox container's IPC, UTS and PID
// namespaces by host paths (/proc/<pid>/ns/...), which name nothing in the
// VM: the container gets new ones there instead (the VM is the pod's
// isolation boundary). The network namespace path is kept: it is the pod
// netns on the host that setupNetwork bridges, and the guest ignores it.
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
