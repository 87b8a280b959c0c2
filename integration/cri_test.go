//go:build integration

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// waitLog waits until the container's log (crictl logs) contains want.
func waitLog(t *testing.T, c *harness.CRI, id, want string) string {
	t.Helper()
	var out string
	if !harness.WaitFor(60*time.Second, func() bool {
		o, e, err := c.Crictl("logs", id)
		out = o + e
		return err == nil && strings.Contains(out, want)
	}) {
		t.Fatalf("log of %s = %q, want %q\n%s", id, out, want, c.LogTail(30))
	}
	return out
}

func podIP(t *testing.T, c *harness.CRI, pod string) string {
	t.Helper()
	ip := c.MustCrictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", pod)
	if !strings.HasPrefix(ip, strings.TrimSuffix(c.Subnet, "0/24")) {
		t.Fatalf("pod ip %q not in %s", ip, c.Subnet)
	}
	return ip
}

func execOut(t *testing.T, c *harness.CRI, id string, cmd ...string) string {
	t.Helper()
	return c.MustCrictl(append([]string{"exec", id}, cmd...)...)
}

// TestCRIPodTwoContainers: a pod with two containers runs in one VM (same
// guest boot id), both see the pod's IP, each has its own rootfs; logs,
// exec, exec -it, attach, stats, inspect, stop and removal work, and no
// QEMU is left afterwards.
func TestCRIPodTwoContainers(t *testing.T) {
	c := harness.StartCRI(t)
	pcfg := c.PodConfig("two", nil)
	pod := c.RunPod(pcfg)
	ip := podIP(t, c, pod)
	if n := len(c.QEMUPids()); n != 1 {
		t.Fatalf("%d QEMU processes after runp, want 1", n)
	}

	script := "echo hello-$NAME; cat /proc/sys/kernel/random/boot_id; ip -4 -o addr show; echo $NAME > /data/who; sleep inf"
	a := c.StartContainer(pod, c.ContainerConfig("a", []string{"sh", "-c", strings.Replace(script, "$NAME", "a", 2)}, nil), pcfg)
	b := c.StartContainer(pod, c.ContainerConfig("b", []string{"sh", "-c", strings.Replace(script, "$NAME", "b", 2)}, nil), pcfg)
	la, lb := waitLog(t, c, a, "scope global"), waitLog(t, c, b, "scope global")
	if n := len(c.QEMUPids()); n != 1 {
		t.Fatalf("%d QEMU processes with two containers, want 1 (one VM per pod)", n)
	}
	bootID := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f-]{27}`)
	ba, bb := bootID.FindString(la), bootID.FindString(lb)
	if ba == "" || ba != bb {
		t.Fatalf("guest boot ids %q and %q: want one VM\nlog a: %s\nlog b: %s", ba, bb, la, lb)
	}
	for name, l := range map[string]string{"a": la, "b": lb} {
		if !strings.Contains(l, " "+ip+"/") {
			t.Fatalf("container %s does not see the pod ip %s:\n%s", name, ip, l)
		}
	}
	// own rootfs each
	if got := execOut(t, c, a, "cat", "/data/who"); got != "a" {
		t.Fatalf("a's /data/who = %q", got)
	}
	if got := execOut(t, c, b, "cat", "/data/who"); got != "b" {
		t.Fatalf("b's /data/who = %q", got)
	}
	// the VM's kernel, not the host's
	if k := execOut(t, c, a, "uname", "-r"); k == hostKernel(t) {
		t.Fatalf("uname -r in the container = host kernel %s", k)
	}
	// exec exit status: ExecSync returns it, the streaming exec reports it
	if _, errs, err := c.Crictl("exec", "--sync", a, "sh", "-c", "exit 7"); err == nil || !strings.Contains(errs, "exited with 7") {
		t.Fatalf("exec --sync of exit 7: %v %q", err, errs)
	}
	if _, errs, err := c.Crictl("exec", a, "sh", "-c", "exit 7"); err == nil || !strings.Contains(errs, "exit code 7") {
		t.Fatalf("streaming exec of exit 7: %v %q", err, errs)
	}
	// exec -it through a pty
	out, err := c.CrictlTTY("exec", "-it", a, "sh", "-c", "tty; echo tty-ok")
	if err != nil || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "tty-ok") {
		t.Fatalf("exec -it = %q %v", out, err)
	}
	// attach: stdin and stdout of a running container through crictl attach
	e := c.StartContainer(pod, c.ContainerConfig("echo", []string{"sh", "-c", "while read l; do echo got-$l; done"}, map[string]any{"stdin": true}), pcfg)
	attach(t, c, e)
	c.MustCrictl("stop", "-t", "1", e)
	c.MustCrictl("rm", e)

	// stats and inspect
	st := c.MustCrictl("stats", "-o", "json", a)
	var stats struct {
		Stats []struct {
			Memory struct {
				WorkingSetBytes struct{ Value string } `json:"workingSetBytes"`
			} `json:"memory"`
			CPU struct {
				UsageCoreNanoSeconds struct{ Value string } `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(st), &stats); err != nil || len(stats.Stats) != 1 {
		t.Fatalf("crictl stats: %v\n%s", err, st)
	}
	if v, _ := strconv.Atoi(stats.Stats[0].Memory.WorkingSetBytes.Value); v == 0 {
		t.Fatalf("crictl stats: no memory working set:\n%s", st)
	}
	if state := c.MustCrictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", a); state != "CONTAINER_RUNNING" {
		t.Fatalf("inspect state = %q", state)
	}

	// stop one container: the other keeps running in the same VM
	c.MustCrictl("stop", "-t", "2", b)
	if state := c.MustCrictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", b); state != "CONTAINER_EXITED" {
		t.Fatalf("b after stop = %q", state)
	}
	c.MustCrictl("rm", b)
	if got := execOut(t, c, a, "cat", "/data/who"); got != "a" {
		t.Fatalf("a after b's removal: %q", got)
	}
	if n := len(c.QEMUPids()); n != 1 {
		t.Fatalf("%d QEMU processes after removing one container, want 1", n)
	}
	c.MustCrictl("stopp", pod)
	c.MustCrictl("rmp", pod)
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 && len(c.ShimPids()) == 0 }) {
		t.Fatalf("after rmp: qemu %v shim %v", c.QEMUPids(), c.ShimPids())
	}
	if ents, _ := os.ReadDir(filepath.Join(c.StateRoot, "vm")); len(ents) > 0 {
		t.Fatalf("sandbox state left under %s/vm: %d", c.StateRoot, len(ents))
	}
}

// attach attaches to container id, which echoes "got-<line>" for each line
// of its stdin, and checks that a line goes through.
func attach(t *testing.T, c *harness.CRI, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := c.CrictlCmd(ctx, "attach", "-i", id)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "got-ping") {
				got <- sc.Text()
				return
			}
		}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-got:
			return
		case <-ctx.Done():
			t.Fatalf("crictl attach: no echo of stdin within 60s")
		case <-tick.C:
			_, _ = io.WriteString(stdin, "ping\n")
		}
	}
}
