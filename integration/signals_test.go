//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestCRIStopRightAfterStart: as containerd's TestContainerStopSignals, a
// container whose shell traps the stop signal is stopped the moment it
// started, several times. The shell is PID 1 of its pid namespace: the
// kernel drops the signal if it comes before the trap is set, which under
// TCG takes the shell hundreds of ms; the agent holds it until then. Each
// stop ends through the trap (exit 0, its line in the log), long before
// the stop timeout's SIGKILL (exit 137). The last container sets its trap
// half a second late, as a slow program would (within the agent's 5 s hold,
// with room for the other lanes' load).
func TestCRIStopRightAfterStart(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfig("stopsig", nil)
	pod := c.RunPod(pcfg)
	const timeout = 30
	for i, script := range []string{
		"trap 'echo trapped; exit 0' TERM; while :; do sleep 0.1; done",
		"trap 'echo trapped; exit 0' TERM; while :; do sleep 0.1; done",
		"trap 'echo trapped; exit 0' TERM; while :; do sleep 0.1; done",
		"sleep 0.5; trap 'echo trapped; exit 0' TERM; while :; do sleep 0.1; done",
	} {
		name := "s" + string(rune('0'+i))
		id := c.MustCrictl("create", pod, c.ContainerConfig(name, []string{"sh", "-c", script}, nil), pcfg)
		c.MustCrictl("start", id)
		start := time.Now()
		c.MustCrictl("stop", "-t", "30", id)
		took := time.Since(start)
		code := c.MustCrictl("inspect", "-o", "go-template", "--template", "{{.status.exitCode}}", id)
		logs, _, _ := c.Crictl("logs", id)
		t.Logf("%s: stopped in %v, exit %s", name, took, code)
		if code != "0" || !strings.Contains(logs, "trapped") {
			t.Errorf("%s: exit %s after %v, log %q: the signal sent right after start did not reach the trap", name, code, took, logs)
		}
		if took > timeout/2*time.Second {
			t.Errorf("%s: the stop took %v", name, took)
		}
		c.MustCrictl("rm", id)
	}
	// How long the agent held each signal, for the window's choice.
	consoles, _ := filepath.Glob(filepath.Join(c.StateRoot, "vm", "*", "console.log"))
	for _, f := range consoles {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "held signal sent") {
				t.Log(strings.TrimSpace(l))
			}
		}
	}
}
