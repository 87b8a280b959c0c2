package shim

import (
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cryo-runtime/cryo/annotations"
)

// tenant is the namespace whose stores and encryption key a sandbox may
// use: its pod's Kubernetes namespace, else (a task made with ctr) the
// containerd namespace the shim serves.
func (s *service) tenant(a map[string]string) string {
	ns, _ := namespaces.Namespace(s.ctx)
	return annotations.Tenant(a, ns)
}
