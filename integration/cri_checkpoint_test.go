//go:build integration

package integration

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// criWorkload keeps state in RAM only and answers on TCP port 7000 with it.
const criWorkload = `head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > /dev/shm/secret
(while true; do echo "counter $(cat /dev/shm/counter) secret $(cat /dev/shm/secret)" | nc -l -p 7000; done) &
i=0; while true; do i=$((i+1)); echo $i > /dev/shm/counter.new; mv /dev/shm/counter.new /dev/shm/counter; sleep 0.1; done`

// TestCRICheckpointRestore: the kubelet's checkpoint path (CRI
// CheckpointContainer, `crictl checkpoint --export`) publishes the pod's VM
// to the store its cryo.dev/checkpoint-to annotation names; a new pod with
// cryo.dev/restore-from continues the workload with its RAM, under the new
// pod's IP, reachable over the pod network.
func TestCRICheckpointRestore(t *testing.T) {
	c := harness.StartCRI(t)
	store := c.StoreURL("pod:v1")
	srcCfg := c.PodConfig("src", map[string]string{"cryo.dev/checkpoint-to": store})
	src := c.RunPod(srcCfg)
	srcIP := podIP(t, c, src)
	app := c.StartContainer(src, c.ContainerConfig("app", []string{"sh", "-c", criWorkload}, nil), srcCfg)
	if !harness.WaitFor(60*time.Second, func() bool {
		o, _, err := c.Crictl("exec", app, "cat", "/dev/shm/counter")
		n, _ := strconv.Atoi(strings.TrimSpace(o))
		return err == nil && n >= 15
	}) {
		o, e, _ := c.Crictl("logs", app)
		x, _, _ := c.Crictl("exec", app, "sh", "-c", "ls -la /dev/shm /dev; mount")
		t.Fatalf("workload not counting: logs %q %q\n%s", o, e, x)
	}
	state := func(id string) (boot, secret string, counter int) {
		f := strings.Fields(execOut(t, c, id, "sh", "-c", "cat /proc/sys/kernel/random/boot_id /dev/shm/secret; echo; cat /dev/shm/counter"))
		if len(f) != 3 {
			t.Fatalf("state of %s: %v", id, f)
		}
		n, _ := strconv.Atoi(f[2])
		return f[0], f[1], n
	}
	boot, secret, counter := state(app)

	export := filepath.Join(c.Dir, "checkpoint.tar")
	c.MustCrictl("checkpoint", "--export="+export, app)
	if st, err := os.Stat(export); err != nil || st.Size() == 0 {
		t.Fatalf("exported checkpoint archive: %v", err)
	}
	// the exported archive references the snapshot
	if ref := tarFile(t, export, "cryo-checkpoint.json"); !strings.Contains(ref, `"url":"`+store+`"`) || !strings.Contains(ref, `"digest":"sha256:`) {
		t.Fatalf("exported archive's cryo-checkpoint.json = %q, want the store url %s and a digest", ref, store)
	}
	// the source runs on (a guest just resumed may take a moment, as in
	// waitAdvance)
	var n int
	if !harness.WaitFor(15*time.Second, func() bool {
		_, _, n = state(app)
		return n > counter
	}) {
		t.Fatalf("source pod stopped counting after the checkpoint: %d, then still %d", counter, n)
	}

	dstCfg := c.PodConfig("dst", map[string]string{"cryo.dev/restore-from": store})
	dst := c.RunPod(dstCfg)
	dstIP := podIP(t, c, dst)
	if dstIP == srcIP {
		t.Fatalf("restored pod has the source's ip %s", dstIP)
	}
	// A container the snapshot does not hold would run its own program
	// beside the checkpointed one: refused, naming both.
	// (CRI creates the task, where the shim refuses, at start.)
	clone := c.MustCrictl("create", dst, c.ContainerConfig("agent-clone", []string{"sh", "-c", "echo this-never-runs"}, nil), dstCfg)
	_, errs, err := c.Crictl("start", clone)
	if err == nil || !strings.Contains(errs, "agent-clone") || !strings.Contains(errs, "is not in the snapshot") || !strings.Contains(errs, "app") {
		t.Fatalf("start container agent-clone in a pod restored from a snapshot of container app: %v\n%s; want a refusal naming both", err, errs)
	}
	c.MustCrictl("rm", clone)
	dapp := c.StartContainer(dst, c.ContainerConfig("app", []string{"sh", "-c", "echo this-never-runs"}, nil), dstCfg)
	if logs, _, _ := c.Crictl("logs", dapp); strings.Contains(logs, "this-never-runs") {
		t.Fatalf("the restored container ran its own command: %q", logs)
	}
	b2, s2, n2 := state(dapp)
	if b2 != boot || s2 != secret || n2 < counter {
		t.Fatalf("restored pod: boot %s secret %s counter %d; checkpointed boot %s secret %s counter %d", b2, s2, n2, boot, secret, counter)
	}
	if addrs := execOut(t, c, dapp, "ip", "-4", "addr"); !strings.Contains(addrs, dstIP+"/") || strings.Contains(addrs, srcIP+"/") {
		t.Fatalf("restored guest addresses %q, want the new pod's %s only", addrs, dstIP)
	}
	// reachable over the pod network at its new address, from the host end
	// of the bridge: the restored listener answers with the carried-over state
	var out string
	if !harness.WaitFor(30*time.Second, func() bool {
		o, _ := c.InNetNS("busybox", "sh", "-c", "echo hi | busybox nc -w 3 "+dstIP+" 7000")
		out = o
		return strings.Contains(o, "secret "+secret)
	}) {
		t.Fatalf("restored pod %s:7000 answered %q", dstIP, out)
	}
	// The source, still running on the same bridge, answers too, with its
	// own counter: the clone took its own pod's MAC instead of sharing the
	// source's.
	mac := func(id string) string {
		return strings.TrimSpace(execOut(t, c, id, "cat", "/sys/class/net/eth0/address"))
	}
	if sm, dm := mac(app), mac(dapp); sm == dm {
		t.Fatalf("source and restored pod share the mac %s on one bridge", sm)
	}
	if !harness.WaitFor(30*time.Second, func() bool {
		o, _ := c.InNetNS("busybox", "sh", "-c", "echo hi | busybox nc -w 3 "+srcIP+" 7000")
		out = o
		return strings.Contains(o, "secret "+secret)
	}) {
		t.Fatalf("source pod %s:7000 answered %q after the restore", srcIP, out)
	}
	if o, _ := c.InNetNS("busybox", "sh", "-c", "echo hi | busybox nc -w 3 "+dstIP+" 7000"); !strings.Contains(o, "secret "+secret) {
		t.Fatalf("restored pod %s:7000 answered %q after the source did", dstIP, o)
	}
	for _, p := range []string{src, dst} {
		c.MustCrictl("stopp", p)
		c.MustCrictl("rmp", p)
	}
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 }) {
		t.Fatalf("QEMU left after rmp: %v", c.QEMUPids())
	}
}

// tarFile returns the content of the first entry of a tar archive whose name
// ends in name.
func tarFile(t *testing.T, archive, name string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("no %s in %s (entries %v)", name, archive, names)
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if strings.HasSuffix(h.Name, name) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
}
