//go:build integration

package integration

import (
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestControllerDeploys: the controller, packaged as
// packaging/kubernetes/controller and built by `make controller-image`,
// runs as a Deployment under runc on the test cluster, reaches the API
// server from its pod (it injects its webhook's CA bundle through it),
// and the API server calls its webhook at the pod's address: a pod naming
// a Checkpoint that does not exist is refused, with the name in the
// message. Restart brings a new pod up that answers the same way.
func TestControllerDeploys(t *testing.T) {
	k := harness.StartK8s(t)
	c := k.StartController(t)

	if rc := k.MustKubectl("-n", harness.ControllerNamespace, "get", "pods", "-o", "jsonpath={.items[*].spec.runtimeClassName}"); rc != harness.RuncHandler {
		t.Fatalf("controller pods run under runtime classes %q, want %q", rc, harness.RuncHandler)
	}
	out := c.TryRestorePod("default", "restore-missing", "missing")
	if !strings.Contains(out, "denied") || !strings.Contains(out, `missing`) {
		t.Fatalf("a pod restoring from Checkpoint missing: %s\nwant a denial naming it", out)
	}
	// The webhook calls only pods that ask for a restore: others pass
	// whatever the controller does.
	plain := harness.Pod("plain", nil, harness.Container("c", "sleep inf"))
	plain["spec"].(map[string]any)["runtimeClassName"] = harness.RuncHandler
	k.Apply(plain)
	k.MustKubectl("delete", "pod", "plain", "--wait=false")

	before := c.Pods()
	c.Restart()
	after := c.Pods()
	if len(after) != 1 || len(before) != 1 || after[0] == before[0] {
		t.Fatalf("controller pods before the restart %v, after %v: want one new pod", before, after)
	}
	if out := c.TryRestorePod("default", "restore-missing", "missing-after-restart"); !strings.Contains(out, "missing-after-restart") {
		t.Fatalf("after the restart, a pod restoring from a missing Checkpoint: %s", out)
	}
}
