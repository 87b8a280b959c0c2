//go:build integration

package integration

import (
	"testing"
	"time"
)

// TestE2BGateway drives the sandbox gateway with the official SDK, with
// busybox httpd on each sandbox's envd port in place of envd (only
// GET /health is asked, and an empty file answers it as envd's 204 does:
// with no body for the SDK to parse): the gateway routes by the SDK's E2b-Sandbox-Id
// over the pod network, answers E2B's 502 for an unknown or paused
// sandbox, and resumes a sandbox created with autoResume on its first
// request after an autoPause, in a new pod restoring the Checkpoint, with
// the server that ran before the pause answering.
func TestE2BGateway(t *testing.T) {
	c := startE2B(t, "e2b_gateway.mjs")
	k := c.k
	ids, created := c.step(t, "create", "", "")
	auto, _ := created["auto"].(string)
	plain, _ := created["plain"].(string)
	if auto == "" || plain == "" {
		t.Fatalf("create printed %v", created)
	}
	for _, id := range []string{auto, plain} {
		pod := "e2b-" + id + "-0"
		k.WaitReady(pod, time.Now(), 3*time.Minute)
		k.Exec(pod, "sandbox", "sh", "-c", "mkdir -p /www && : > /www/health && httpd -p 49983 -h /www")
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
