package shim

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/sandbox"
)

func TestClaim(t *testing.T) {
	rs := newRestored(&sandbox.Restored{SandboxID: "pod", Containers: []sandbox.RecordContainer{
		{GuestID: "pod", Name: ""}, {GuestID: "app1", Name: "app"}, {GuestID: "side1", Name: "sidecar"},
	}})
	named := func(n string) map[string]string { return map[string]string{annotations.CRIContainerName: n} }
	if c, ok, err := rs.claim(map[string]string{}, true); err != nil || !ok || c.GuestID != "pod" {
		t.Fatalf("first task claimed %+v %v %v, want the sandbox container", c, ok, err)
	}
	if c, ok, err := rs.claim(named("sidecar"), false); err != nil || !ok || c.GuestID != "side1" {
		t.Fatalf("sidecar claimed %+v %v %v", c, ok, err)
	}
	// The kubelet restarting the sidecar: a fresh container, no refusal.
	if _, ok, err := rs.claim(named("sidecar"), false); ok || err != nil {
		t.Fatalf("second sidecar: claimed %v, error %v; want a fresh container", ok, err)
	}
	_, ok, err := rs.claim(named("other"), false)
	if ok || err == nil || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a container named other: claimed %v, error %v; want a refusal", ok, err)
	}
	for _, want := range []string{`"other"`, `["app" "sidecar"]`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %s", err, want)
		}
	}
	if left := rs.unclaimed(); len(left) != 1 || left[0].GuestID != "app1" {
		t.Fatalf("unclaimed %+v, want app1", left)
	}
	if left := rs.unclaimed(); len(left) != 0 {
		t.Fatalf("unclaimed handed out twice: %+v", left)
	}
}

// TestClaimFinished: an init container of the source pod, which had ended
// when it was checkpointed, runs again in the restored pod.
func TestClaimFinished(t *testing.T) {
	rs := newRestored(&sandbox.Restored{SandboxID: "pod", Containers: []sandbox.RecordContainer{{GuestID: "pod"}, {GuestID: "app1", Name: "app"}}, Finished: []string{"init"}})
	if _, ok, err := rs.claim(map[string]string{}, true); !ok || err != nil {
		t.Fatalf("sandbox container: claimed %v, error %v", ok, err)
	}
	if _, ok, err := rs.claim(map[string]string{annotations.CRIContainerName: "init"}, false); ok || err != nil {
		t.Fatalf("init container: claimed %v, error %v; want a fresh container", ok, err)
	}
}

func TestClaimSnapshotWithoutNames(t *testing.T) {
	rs := newRestored(&sandbox.Restored{SandboxID: "box", Containers: []sandbox.RecordContainer{{GuestID: "box"}}})
	if _, ok, err := rs.claim(map[string]string{annotations.CRIContainerType: "sandbox"}, true); !ok || err != nil {
		t.Fatalf("pause container: claimed %v, error %v", ok, err)
	}
	_, _, err := rs.claim(map[string]string{annotations.CRIContainerName: "app"}, false)
	if err == nil || !strings.Contains(err.Error(), "none with a name") {
		t.Fatalf("a pod container restored from a snapshot of a container outside a pod: %v, want a refusal", err)
	}
}
