//go:build integration

package integration

import (
	"testing"
)

// TestE2BGateway drives the sandbox gateway with the official SDK, asking
// only envd's GET /health (Sandbox.isRunning): the gateway routes by the
// SDK's E2b-Sandbox-Id over the pod network, answers E2B's 502 for an
// unknown or paused sandbox, and resumes a sandbox created with
// autoResume on its first request after an autoPause, in a new pod
// restoring the Checkpoint, whose envd (restored, not started again)
// answers.
func TestE2BGateway(t *testing.T) {
	c := startE2B(t, "e2b_gateway.mjs")
	k := c.k
	ids, created := c.step(t, "create", "", "")
	auto, _ := created["auto"].(string)
	plain, _ := created["plain"].(string)
	if auto == "" || plain == "" {
		t.Fatalf("create printed %v", created)
	}
	c.step(t, "running", "", ids)
	c.step(t, "paused", "", ids)
	if got := k.MustKubectl("get", "pod", "e2b-"+auto+"-1", "-o", "jsonpath={.metadata.annotations.cryo\\.dev/restore-checkpoint}"); got != "e2b-"+auto+"-0" {
		t.Errorf("the pod the gateway resumed restores %q, want e2b-%s-0", got, auto)
	}
	if out, _, err := k.Kubectl("get", "pod", "e2b-"+plain+"-1", "-o", "name"); err == nil {
		t.Errorf("the gateway resumed the sandbox without autoResume: %s", out)
	}
}
