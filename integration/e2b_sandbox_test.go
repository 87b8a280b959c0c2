//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// e2bCluster is the test cluster with the controller serving E2B's API
// (E2B_API_URL, port 3000) and the sandbox gateway (E2B_SANDBOX_URL, port
// 3001), the template "base" of harness.E2BTemplateImage, and two API
// keys: keyA for namespace default, keyB for namespace other.
type e2bCluster struct {
	k        *harness.K8s
	sdk      string
	apiURL   string
	boxURL   string
	keyA     string
	keyB     string
	scriptOf string
}

func startE2B(t testing.TB, script string) *e2bCluster {
	t.Helper()
	sdk := harness.E2BSDK(t)
	k := harness.StartK8s(t)
	tpl := k.ImportE2BTemplate(t)
	k.StartController(t, harness.ControllerArgs("--e2b-templates=base="+tpl))
	c := &e2bCluster{k: k, sdk: sdk, keyA: "e2b-key-team-default", keyB: "e2b-key-team-other"}
	apiKey(t, k, "team-default", "default", c.keyA)
	apiKey(t, k, "team-other", "other", c.keyB)
	ip := strings.TrimSpace(k.MustKubectl("-n", harness.ControllerNamespace, "get", "pods",
		"-l", "app.kubernetes.io/name=cryo-controller", "-o", "jsonpath={.items[0].status.podIP}"))
	if ip == "" {
		t.Fatal("the controller's pod has no address")
	}
	c.apiURL, c.boxURL = "http://"+ip+":3000", "http://"+ip+":3001"
	var err error
	if c.scriptOf, err = filepath.Abs(filepath.Join("testdata", script)); err != nil {
		t.Fatal(err)
	}
	// Whatever the steps created (sandboxes from snapshots, forks) goes
	// with the cluster; this only stops their VMs sooner.
	t.Cleanup(func() { k.Kubectl("delete", "pod,checkpoint", "-A", "-l", "cryo.dev/e2b-sandbox", "--wait=false") })
	return c
}

// step runs one step of the script with the SDK configured by the three
// environment variables only (and OTHER_KEY, test data), in the
// cluster's network namespace where the controller's pod is reachable;
// it returns the step's JSON line, raw and decoded.
func (c *e2bCluster) step(t testing.TB, step, id, state string) (string, map[string]any) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "nsenter", "--net="+c.k.NetNS, "node", c.scriptOf, step, id, state)
	cmd.Env = append(os.Environ(), "E2B_API_URL="+c.apiURL, "E2B_SANDBOX_URL="+c.boxURL, "E2B_API_KEY="+c.keyA,
		"OTHER_KEY="+c.keyB, "RUN=it", "E2B_SDK_DIR="+c.sdk)
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("SDK step %s (after %s): %v\n%s%s\ncontroller log:\n%s", step, time.Since(start).Round(time.Millisecond), err, out, stderr, c.controllerLog())
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("SDK step %s printed %q: %v", step, out, err)
	}
	t.Logf("SDK step %s: %s in %s", step, strings.TrimSpace(string(out)), time.Since(start).Round(time.Millisecond))
	return strings.TrimSpace(string(out)), res
}

func (c *e2bCluster) controllerLog() string {
	out, _, _ := c.k.Kubectl("-n", harness.ControllerNamespace, "logs", "-l", "app.kubernetes.io/name=cryo-controller", "--tail=40")
	return out
}

// TestE2BSandbox drives a sandbox end to end with the official SDK
// through the API and the gateway to envd in the guest: commands
// (stdout, stderr, exit code, stdin, a PTY, a background counter), files
// (write, read, list, watch); pause (the pod gone, its Checkpoint
// Succeeded with bytes uploaded); connect (the same files, the counter
// moved on, attached with commands.connect, in a new pod); a snapshot and
// a sandbox from it; fork; list by state; the refusals (unknown id, a
// wrong envd token, a bad key, another namespace's key); an autoPause
// sandbox then connect; an autoResume sandbox resumed by the gateway on
// its first envd call, whose VM then dies: gone for the SDK at once (not
// resumed from its pause), its pod, Checkpoint and Secret removed by the
// reaper at its timeout; the first sandbox's resumed pod deleted with
// kubectl: gone for the SDK (connect, getInfo, setTimeout not found, not
// listed, not running), not resumed from its pause; kill.
func TestE2BSandbox(t *testing.T) {
	c := startE2B(t, "e2b_sandbox.mjs")
	k := c.k
	state, created := c.step(t, "create", "", "")
	id, _ := created["id"].(string)
	if id == "" {
		t.Fatalf("create printed %v", created)
	}
	pod0, pod1 := "e2b-"+id+"-0", "e2b-"+id+"-1"
	if h := k.MustKubectl("get", "pod", pod0, "-o", "jsonpath={.metadata.annotations.cryo\\.dev/envd-access-token-sha256}"); len(h) != 64 {
		t.Errorf("pod %s: envd token hash annotation %q, want 64 hex digits", pod0, h)
	}
	before := counterIn(t, k, pod0)

	state, _ = c.step(t, "pause", id, state)
	if out, _, err := k.Kubectl("get", "pod", pod0, "-o", "name"); err == nil {
		t.Errorf("pod %s still there after pause: %s", pod0, out)
	}
	if ph := k.MustKubectl("get", "checkpoint", pod0, "-o", "jsonpath={.status.phase} {.spec.keepRunning}"); ph != "Succeeded false" {
		t.Errorf("Checkpoint %s after pause: phase and keepRunning %q, want Succeeded false", pod0, ph)
	}
	if up, _ := strconv.ParseInt(k.MustKubectl("get", "checkpoint", pod0, "-o", "jsonpath={.status.uploadedBytes}"), 10, 64); up <= 0 {
		t.Errorf("Checkpoint %s uploaded %d bytes", pod0, up)
	}

	state, _ = c.step(t, "connect", id, state)
	if got := k.MustKubectl("get", "pod", pod1, "-o", "jsonpath={.status.phase} {.metadata.annotations.cryo\\.dev/restore-checkpoint}"); got != "Running "+pod0 {
		t.Errorf("resumed pod %s: phase and restore-checkpoint %q, want Running %s", pod1, got, pod0)
	}
	if after := counterIn(t, k, pod1); after <= before {
		t.Errorf("the counter in the resumed pod is %d, was %d before the pause", after, before)
	}

	state, _ = c.step(t, "snapshot", id, state)
	state, _ = c.step(t, "fork", id, state)
	state, _ = c.step(t, "list", id, state)
	c.step(t, "refusals", id, state)

	_, auto := c.step(t, "autopause", "", "")
	if autoID, _ := auto["id"].(string); autoID == "" {
		t.Errorf("autopause printed %v", auto)
	}
	_, ar := c.step(t, "autoresume", "", "")
	arID, _ := ar["id"].(string)
	if got := k.MustKubectl("get", "pod", "e2b-"+arID+"-1", "-o", "jsonpath={.metadata.annotations.cryo\\.dev/restore-checkpoint} {.metadata.annotations.e2b\\.cryo\\.dev/auto-resume}"); got != "e2b-"+arID+"-0 true" {
		t.Errorf("the pod the gateway resumed: restore-checkpoint and auto-resume %q, want e2b-%s-0 true", got, arID)
	}

	// The autoresume sandbox dies: its VM killed. It is gone for the
	// SDK at once, its objects stay until its timeout, and the reaper
	// removes them then.
	_, tm := c.step(t, "timeout", arID, "")
	endAt, err := time.Parse(time.RFC3339Nano, fmt.Sprint(tm["endAt"]))
	if err != nil {
		t.Fatalf("timeout printed %v: %v", tm, err)
	}
	died := killVM(t, k, "e2b-"+arID+"-1")
	c.step(t, "ended", arID, "")
	if time.Now().After(endAt) {
		t.Fatalf("the ended sandbox's timeout (%s) passed before the checks: they did not test an ended sandbox", endAt)
	}
	if got := k.MustKubectl("get", "pod,checkpoint,secret", "-l", "cryo.dev/e2b-sandbox="+arID, "-o", "name"); strings.Count(got, "\n") != 2 {
		t.Errorf("the ended sandbox's objects before its timeout: %q, want its pod, its pause's Checkpoint and its token Secret", got)
	}

	// Its resumed pod deleted outside the API (kubectl delete pod, as an
	// eviction or a drain does): the sandbox is gone, as one that died,
	// not back at the pause it was resumed from; kill still removes it.
	if got := k.MustKubectl("get", "checkpoint", pod0, "-o", "jsonpath={.metadata.annotations.e2b\\.cryo\\.dev/resumed-as}"); got != pod1 {
		t.Errorf("Checkpoint %s: resumed-as %q, want %s", pod0, got, pod1)
	}
	k.MustKubectl("delete", "pod", pod1)
	c.step(t, "ended", id, "")

	c.step(t, "kill", id, state)
	if !harness.WaitFor(time.Minute, func() bool {
		out, _, err := k.Kubectl("get", "pod,checkpoint", "-l", "cryo.dev/e2b-sandbox="+id, "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	}) {
		out, _, _ := k.Kubectl("get", "pod,checkpoint", "-l", "cryo.dev/e2b-sandbox="+id)
		t.Errorf("after kill the sandbox still has:\n%s", out)
	}

	if !harness.WaitFor(time.Until(endAt)+time.Minute, func() bool {
		out, _, err := k.Kubectl("get", "pod,checkpoint,secret", "-l", "cryo.dev/e2b-sandbox="+arID, "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	}) {
		out, _, _ := k.Kubectl("get", "pod,checkpoint,secret", "-l", "cryo.dev/e2b-sandbox="+arID)
		t.Fatalf("a minute after its timeout the ended sandbox still has:\n%s", out)
	}
	t.Logf("the ended sandbox removed %s after its VM died, %s after its timeout", time.Since(died).Round(time.Second), time.Since(endAt).Round(time.Second))
	if logs, _, _ := k.Kubectl("-n", harness.ControllerNamespace, "logs", "-l", "app.kubernetes.io/name=cryo-controller", "--tail=-1"); !strings.Contains(logs, "ended sandbox removed at its timeout") || !strings.Contains(logs, arID) {
		t.Errorf("the controller's log has no removal of ended sandbox %s: the reaper killed it as a running one", arID)
	}
}

// killVM kills the QEMU of pod (its VM dies, as on a crash) and waits
// until the kubelet has ended the pod; it returns when the VM died.
func killVM(t *testing.T, k *harness.K8s, pod string) time.Time {
	t.Helper()
	q := sandboxQEMU(k.MustCrictl("pods", "-q", "--name", "^"+pod+"$", "--state", "ready"))
	if len(q) != 1 {
		t.Fatalf("QEMU of pod %s: %v, want one", pod, q)
	}
	if err := syscall.Kill(q[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	var phase string
	if !harness.WaitFor(2*time.Minute, func() bool {
		phase, _, _ = k.Kubectl("get", "pod", pod, "-o", "jsonpath={.status.phase}")
		return phase == "Failed" || phase == "Succeeded"
	}) {
		t.Fatalf("pod %s is %q 2 minutes after its VM was killed, want Failed", pod, phase)
	}
	t.Logf("pod %s %s %s after its VM was killed", pod, phase, time.Since(died).Round(time.Millisecond))
	return died
}

// counterIn reads the background counter's file in a sandbox's pod
// (kubectl exec: the cluster's view, not the SDK's).
func counterIn(t *testing.T, k *harness.K8s, pod string) int {
	t.Helper()
	out := strings.TrimSpace(k.Exec(pod, "sandbox", "cat", "/home/user/counter"))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("counter in %s: %q", pod, out)
	}
	return n
}

// BenchmarkE2BPauseResume: pause (Sandbox.pause until it returns: the
// Checkpoint Succeeded and the pod gone) and resume (Sandbox.connect of
// the paused sandbox until the first command's output through the
// gateway) through the SDK, p50 and p95 over b.N cycles (make bench-e2b:
// 20), with the bytes each pause uploaded, against E2B's published
// figures (pause about 4 s per GiB of RAM, resume about 1 s) and Agent
// Substrate's (resume p50 about 290 ms, target p95 100 ms).
func BenchmarkE2BPauseResume(b *testing.B) {
	c := startE2B(b, "e2b_sandbox.mjs")
	_, created := c.step(b, "bench-create", "", "")
	id, _ := created["id"].(string)
	if id == "" {
		b.Fatalf("bench-create printed %v", created)
	}
	var pause, resume []time.Duration
	var uploaded []int64
	for i := 0; b.Loop(); i++ {
		_, p := c.step(b, "bench-pause", id, "")
		pause = append(pause, msOf(b, p))
		cp := fmt.Sprintf("e2b-%s-%d", id, i)
		up, _ := strconv.ParseInt(c.k.MustKubectl("get", "checkpoint", cp, "-o", "jsonpath={.status.uploadedBytes}"), 10, 64)
		uploaded = append(uploaded, up)
		_, r := c.step(b, "bench-resume", id, "")
		resume = append(resume, msOf(b, r))
	}
	var total int64
	for _, u := range uploaded {
		total += u
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
		e2b  string
	}{
		{"pause", pause, "E2B: about 4 s per GiB of RAM"},
		{"resume", resume, "E2B: about 1 s; Agent Substrate: p50 about 290 ms, target p95 100 ms"},
	} {
		p50, p95 := percentile(m.d, 50), percentile(m.d, 95)
		b.ReportMetric(p50.Seconds(), m.name+"-p50-s")
		b.ReportMetric(p95.Seconds(), m.name+"-p95-s")
		b.Logf("%s over %d cycles: p50 %s, p95 %s (%s); all %v", m.name, len(m.d), p50, p95, m.e2b, m.d)
	}
	if len(uploaded) > 0 {
		b.ReportMetric(float64(total)/float64(len(uploaded)), "uploaded-B/pause")
		b.Logf("uploaded per pause: mean %d B, first %d B (the full snapshot), then %v", total/int64(len(uploaded)), uploaded[0], uploaded[1:])
	}
}

func msOf(b *testing.B, res map[string]any) time.Duration {
	b.Helper()
	ms, ok := res["ms"].(float64)
	if !ok {
		b.Fatalf("step printed %v, want ms", res)
	}
	return time.Duration(ms * float64(time.Millisecond))
}
