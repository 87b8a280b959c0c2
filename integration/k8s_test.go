//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stack"
)

// k8sCounter keeps its state in the guest's RAM only (/dev/shm) and serves
// HTTP (busybox httpd) and TCP (nc) for the kubelet's probes.
const k8sCounter = `echo hello from $(hostname); mkdir -p /www; echo ok > /www/healthz
httpd -p 8080 -h /www
(while true; do echo tcp-ok | nc -l -p 7000; done) &
i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; echo counter $i; sleep 1; done`

// TestK8s drives cryo through a real kube-apiserver and kubelet (one
// control plane for all subtests, which run in order): probes, logs, exec,
// VM size from limits, checkpoint through the kubelet's API and restore by
// annotation, a failed restore's events, restarts in the same VM, and
// deletes that leave no QEMU.
func TestK8s(t *testing.T) {
	k := harness.StartK8s(t)
	store := k.StoreURL("k8s-web:v1")
	var boot string
	var counterAtCheckpoint int

	t.Run("probes, logs, exec", func(t *testing.T) {
		k := k.T(t)
		c := harness.Container("web", k8sCounter)
		c["readinessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/healthz", "port": 8080}, "periodSeconds": 1}
		// A failed liveness probe would end web for every later subtest
		// (restartPolicy Never): slack for a guest the other lanes slow.
		c["livenessProbe"] = map[string]any{"tcpSocket": map[string]any{"port": 7000}, "periodSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 5}
		c["startupProbe"] = map[string]any{"exec": map[string]any{"command": []string{"sh", "-c", "test -s /dev/shm/n"}}, "periodSeconds": 1, "failureThreshold": 120}
		start := time.Now()
		k.Apply(harness.Pod("web", map[string]string{"cryo.dev/checkpoint-to": store}, c))
		t.Logf("pod web Ready after %s (cold boot)", k.WaitReady("web", start, 3*time.Minute))
		if !harness.WaitFor(30*time.Second, func() bool {
			out, _, _ := k.Kubectl("logs", "web")
			return strings.Contains(out, "hello from web") && strings.Contains(out, "counter 3")
		}) {
			out, errs, _ := k.Kubectl("logs", "web")
			t.Fatalf("kubectl logs web: %q %q", out, errs)
		}
		if out := k.Exec("web", "web", "sh", "-c", "echo exec-$(hostname)"); out != "exec-web" {
			t.Fatalf("kubectl exec = %q", out)
		}
		cmd := k.Cluster.KubectlCmd(t.Context(), "exec", "-i", "web", "--", "tr", "a-z", "A-Z")
		cmd.Stdin = strings.NewReader("through stdin\n")
		if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "THROUGH STDIN" {
			t.Fatalf("kubectl exec -i = %q, %v", out, err)
		}
		// kubectl exec -it at a terminal: the guest's pty has its size.
		tty := stack.AtTerminal(t.Context(), k.Cluster.KubectlCmd(t.Context(), "exec", "-it", "web", "--", "sh", "-c", stack.TTYSizeScript))
		if out, err := tty.CombinedOutput(); err != nil || !strings.Contains(string(out), fmt.Sprintf("%d %d", stack.TTYRows, stack.TTYCols)) {
			t.Fatalf("kubectl exec -it web -- stty size = %q, %v; want the terminal's %d %d", out, err, stack.TTYRows, stack.TTYCols)
		}
		// The probes passed through the kubelet (Ready), and keep passing.
		if n := k.MustKubectl("get", "pod", "web", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"); n != "0" {
			t.Fatalf("restartCount %s: the liveness probe failed", n)
		}
		boot = k.Exec("web", "web", "cat", "/proc/sys/kernel/random/boot_id")
		logOverhead(t, k, "web")
	})

	t.Run("limits size the vm", func(t *testing.T) {
		k := k.T(t)
		c := harness.Container("sized", "sleep inf")
		c["resources"] = map[string]any{"limits": map[string]any{"cpu": "1", "memory": "256Mi"}}
		k.Apply(harness.Pod("sized", nil, c))
		k.WaitReady("sized", time.Now(), 3*time.Minute)
		// The stack's default VM: 1 vCPU, 256 MiB; plus the limits.
		if n := k.Exec("sized", "sized", "sh", "-c", "nproc"); n != "2" {
			t.Fatalf("guest nproc = %s, want 2 (1 default + 1 cpu limit)", n)
		}
		kb, _ := strconv.Atoi(k.Exec("sized", "sized", "sh", "-c", "grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2"))
		if kb < 400*1024 || kb > 512*1024 {
			t.Fatalf("guest MemTotal %d kB, want about 512 MiB (256 default + 256Mi limit)", kb)
		}
		logOverhead(t, k, "sized")
		// No cryo.dev/checkpoint-to and no default store: the kubelet's
		// checkpoint is refused with what to set, and the pod runs on.
		_, err := k.KubeletCheckpoint("default", "sized", "sized")
		if err == nil || !strings.Contains(err.Error(), "cryo.dev/checkpoint-to") || !strings.Contains(err.Error(), "default_checkpoint_to") {
			t.Fatalf("kubelet checkpoint of a pod without a store: %v; want a refusal naming cryo.dev/checkpoint-to and default_checkpoint_to", err)
		}
		t.Logf("kubelet checkpoint without a store: %.300s", err)
		if out := k.Exec("sized", "sized", "echo", "alive"); out != "alive" {
			t.Fatalf("pod after a refused checkpoint: %q", out)
		}
		deleteAndCheck(t, k, "sized")
	})

	t.Run("read-only volumes", func(t *testing.T) {
		readonlyVolumes(t, k.T(t))
	})

	t.Run("checkpoint through the kubelet, restore by annotation", func(t *testing.T) {
		k := k.T(t)
		if boot == "" {
			t.Fatal("no source pod")
		}
		// Read before: the guest counts on while the snapshot is
		// published, so a read after it can run ahead of the restored
		// guest by the publish's time.
		counterAtCheckpoint = podCounter(t, k, "web")
		start := time.Now()
		items, err := k.KubeletCheckpoint("default", "web", "web")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubelet checkpoint took %s: %v", time.Since(start), items)
		if out, errs, err := k.Cryoctl("inspect", store); err != nil || !strings.Contains(out, "sha256:") {
			t.Fatalf("cryoctl inspect %s: %v\n%s%s", store, err, out, errs)
		}
		start = time.Now()
		k.Apply(harness.Pod("web-restored", map[string]string{"cryo.dev/restore-from": store},
			harness.Container("web", "echo this never runs; sleep inf")))
		t.Logf("pod web-restored Ready after %s (restored)", k.WaitReady("web-restored", start, 3*time.Minute))
		if b := k.Exec("web-restored", "web", "cat", "/proc/sys/kernel/random/boot_id"); b != boot {
			t.Fatalf("restored guest boot id %s, want the checkpointed guest's %s", b, boot)
		}
		n := podCounter(t, k, "web-restored")
		if n < counterAtCheckpoint || n == 0 {
			t.Fatalf("restored counter %d, %d just before the checkpoint: the RAM state did not carry over", n, counterAtCheckpoint)
		}
		if h := k.Exec("web-restored", "web", "hostname"); h != "web-restored" {
			t.Fatalf("restored pod's hostname %q", h)
		}
		deleteAndCheck(t, k, "web-restored")
	})

	t.Run("restore with other limits than the snapshot is refused", func(t *testing.T) {
		k := k.T(t)
		c := harness.Container("web", "sleep inf")
		c["resources"] = map[string]any{"limits": map[string]any{"memory": "128Mi"}}
		k.Apply(harness.Pod("web-resized", map[string]string{"cryo.dev/restore-from": store}, c))
		var ev string
		if !harness.WaitFor(2*time.Minute, func() bool {
			ev, _, _ = k.Kubectl("get", "events", "--field-selector", "involvedObject.name=web-resized", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
			return strings.Contains(ev, "FailedCreatePodSandBox") && strings.Contains(ev, "asks for 384 MiB of memory")
		}) {
			d, _, _ := k.Kubectl("describe", "pod", "web-resized")
			t.Fatalf("no FailedCreatePodSandBox event with the size mismatch:\n%s\n%s", ev, d)
		}
		deleteAndCheck(t, k, "web-resized")
	})

	t.Run("failed restore under fail shows the reason in events; cold boots", func(t *testing.T) {
		k := k.T(t)
		missing := k.StoreURL("nothing-here:v1")
		k.Apply(harness.Pod("broken", map[string]string{"cryo.dev/restore-from": missing, "cryo.dev/restore-fallback": "fail"},
			harness.Container("app", "sleep inf")))
		var ev string
		if !harness.WaitFor(2*time.Minute, func() bool {
			ev, _, _ = k.Kubectl("get", "events", "--field-selector", "involvedObject.name=broken", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
			return strings.Contains(ev, "FailedCreatePodSandBox") && strings.Contains(ev, "nothing-here")
		}) {
			d, _, _ := k.Kubectl("describe", "pod", "broken")
			t.Fatalf("no FailedCreatePodSandBox event naming the snapshot:\n%s\n%s", ev, d)
		}
		if phase := k.MustKubectl("get", "pod", "broken", "-o", "jsonpath={.status.phase}"); phase != "Pending" {
			t.Fatalf("pod with a failed restore is %s, want Pending", phase)
		}
		for _, l := range strings.Split(ev, "\n") {
			if strings.HasPrefix(l, "FailedCreatePodSandBox") {
				t.Logf("event: %.400s", l)
				break
			}
		}
		deleteAndCheck(t, k, "broken")

		k.Apply(harness.Pod("coldfb", map[string]string{"cryo.dev/restore-from": missing, "cryo.dev/restore-fallback": "cold"},
			harness.Container("app", "echo booted-cold; sleep inf")))
		k.WaitReady("coldfb", time.Now(), 3*time.Minute)
		// Ready comes with the container's start; its first line may
		// reach the log a moment later.
		if !harness.WaitFor(30*time.Second, func() bool {
			out, _, _ := k.Kubectl("logs", "coldfb")
			return strings.Contains(out, "booted-cold")
		}) {
			out, errs, _ := k.Kubectl("logs", "coldfb")
			t.Fatalf("cold fallback pod's log %q %q", out, errs)
		}
		deleteAndCheck(t, k, "coldfb")
	})

	t.Run("restartPolicy Always restarts in the same vm", func(t *testing.T) {
		k := k.T(t)
		p := harness.Pod("restarts", nil, harness.Container("app", "cat /proc/sys/kernel/random/boot_id; sleep 5; exit 3"))
		p["spec"].(map[string]any)["restartPolicy"] = "Always"
		k.Apply(p)
		k.WaitReady("restarts", time.Now(), 3*time.Minute)
		sandbox := k.MustCrictl("pods", "-q", "--name", "^restarts$")
		qemu := sandboxQEMU(sandbox)
		if len(qemu) != 1 {
			t.Fatalf("QEMU of the pod: %v", qemu)
		}
		// Each run prints the guest's boot id: one VM for all of them.
		bootID := func() string {
			out, _, _ := k.Kubectl("logs", "restarts")
			return strings.TrimSpace(out)
		}
		var first string
		if !harness.WaitFor(30*time.Second, func() bool { first = bootID(); return len(first) == 36 }) {
			t.Fatalf("first run's log %q, want its boot id", first)
		}
		if !harness.WaitFor(3*time.Minute, func() bool {
			n, _, _ := k.Kubectl("get", "pod", "restarts", "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
			c, _ := strconv.Atoi(strings.TrimSpace(n))
			return c >= 2
		}) {
			d, _, _ := k.Kubectl("describe", "pod", "restarts")
			t.Fatalf("container not restarted twice:\n%s", d)
		}
		code := k.MustKubectl("get", "pod", "restarts", "-o", "jsonpath={.status.containerStatuses[0].lastState.terminated.exitCode}")
		if code != "3" {
			t.Fatalf("last exit code %q, want 3", code)
		}
		if q := sandboxQEMU(sandbox); len(q) != 1 || q[0] != qemu[0] {
			t.Fatalf("QEMU pids %v, at the first run %v: the restart made a new VM", q, qemu)
		}
		// The log now is the third (or later) run's.
		if !harness.WaitFor(30*time.Second, func() bool { return bootID() == first }) {
			t.Fatalf("boot id of a later run %q, of the first %q", bootID(), first)
		}
		deleteAndCheck(t, k, "restarts")
	})

	t.Run("init container and two containers in one vm", func(t *testing.T) {
		k := k.T(t)
		p := harness.Pod("multi", nil, harness.Container("a", "sleep inf"), harness.Container("b", "sleep inf"))
		init := harness.Container("init", "echo init ran")
		init["image"], init["imagePullPolicy"] = harness.Image, "Never"
		p["spec"].(map[string]any)["initContainers"] = []any{init}
		k.Apply(p)
		k.WaitReady("multi", time.Now(), 3*time.Minute)
		if st := k.MustKubectl("get", "pod", "multi", "-o", "jsonpath={.status.initContainerStatuses[0].state.terminated.reason}/{.status.initContainerStatuses[0].state.terminated.exitCode}"); st != "Completed/0" {
			t.Fatalf("init container state %q, want Completed/0", st)
		}
		if out := k.MustKubectl("logs", "multi", "-c", "init"); out != "init ran" {
			t.Fatalf("init container log %q", out)
		}
		ba := k.Exec("multi", "a", "cat", "/proc/sys/kernel/random/boot_id")
		if bb := k.Exec("multi", "b", "cat", "/proc/sys/kernel/random/boot_id"); ba != bb {
			t.Fatalf("containers a and b run in different guests: boot ids %s, %s", ba, bb)
		}
		if q := sandboxQEMU(k.MustCrictl("pods", "-q", "--name", "^multi$")); len(q) != 1 {
			t.Fatalf("QEMU of pod multi: %v, want one", q)
		}
		deleteAndCheck(t, k, "multi")
	})

	t.Run("shareProcessNamespace and kubectl debug --target", func(t *testing.T) {
		k := k.T(t)
		shared := harness.Pod("shared", nil, harness.Container("a", "exec sleep 1001"), harness.Container("b", "exec sleep 1002"))
		shared["spec"].(map[string]any)["shareProcessNamespace"] = true
		k.Apply(shared)
		debugged := harness.Pod("debugged", nil, harness.Container("app", "exec sleep 1003"), harness.Container("side", "exec sleep 1004"))
		k.Apply(debugged)
		k.WaitReady("shared", time.Now(), 3*time.Minute)
		k.WaitReady("debugged", time.Now(), 3*time.Minute)
		if ps := k.Exec("shared", "b", "ps"); !strings.Contains(ps, "sleep 1001") {
			t.Errorf("b of a pod that shares its process namespace does not see a's sleep 1001:\n%s", ps)
		}
		if ps := k.Exec("debugged", "side", "ps"); strings.Contains(ps, "sleep 1003") {
			t.Errorf("side sees app's sleep 1003 in a pod that does not share its process namespace:\n%s", ps)
		}
		k.MustKubectl("debug", "debugged", "--image="+harness.Image, "--image-pull-policy=Never", "--target=app", "-c", "dbg", "--", "sleep", "inf")
		if !harness.WaitFor(2*time.Minute, func() bool {
			out, _, err := k.Kubectl("get", "pod", "debugged", "-o", "jsonpath={.status.ephemeralContainerStatuses[0].state.running.startedAt}")
			return err == nil && strings.TrimSpace(out) != ""
		}) {
			d, _, _ := k.Kubectl("describe", "pod", "debugged")
			t.Fatalf("debug container not running within 2 minutes:\n%s", d)
		}
		ps := k.Exec("debugged", "dbg", "ps")
		if !strings.Contains(ps, "sleep 1003") || strings.Contains(ps, "sleep 1004") {
			t.Errorf("the debug container that targets app sees, want app's sleep 1003 and not side's sleep 1004:\n%s", ps)
		}
		deleteAndCheck(t, k, "shared")
		deleteAndCheck(t, k, "debugged")
	})

	t.Run("a deployment is scheduled, replaced and garbage-collected", func(t *testing.T) {
		k := k.T(t)
		pod := harness.Pod("fleet", nil, harness.Container("agent", "echo warm; sleep inf"))
		spec := pod["spec"].(map[string]any)
		delete(spec, "nodeName") // the scheduler places it
		spec["restartPolicy"] = "Always"
		k.Apply(map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": "fleet"},
			"spec": map[string]any{
				"replicas": 1,
				"selector": map[string]any{"matchLabels": map[string]any{"app": "fleet"}},
				"template": map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "fleet"}}, "spec": spec},
			},
		})
		first := fleetPod(t, k, "")
		if node := k.MustKubectl("get", "pod", first, "-o", "jsonpath={.spec.nodeName}"); node != harness.NodeName {
			t.Fatalf("pod %s scheduled to %q, want %s", first, node, harness.NodeName)
		}
		if q := sandboxQEMU(k.MustCrictl("pods", "-q", "--name", "^"+first+"$")); len(q) != 1 {
			t.Fatalf("QEMU of pod %s: %v, want one (runtimeClassName cryo)", first, q)
		}
		// The ReplicaSet's controller replaces a deleted pod.
		deleteAndCheck(t, k, first)
		second := fleetPod(t, k, first)
		// Deleting the Deployment lets the garbage collector remove its
		// ReplicaSet and that pod, and the kubelet its VM.
		ids := strings.Fields(k.MustCrictl("pods", "-q", "--name", "^"+second+"$"))
		k.MustKubectl("delete", "deployment", "fleet", "--cascade=background")
		if !harness.WaitFor(2*time.Minute, func() bool {
			rs, _, _ := k.Kubectl("get", "replicaset", "-l", "app=fleet", "-o", "name")
			pods, _, _ := k.Kubectl("get", "pod", "-l", "app=fleet", "-o", "name")
			return strings.TrimSpace(rs) == "" && strings.TrimSpace(pods) == ""
		}) {
			t.Fatalf("replicaset or pods of deployment fleet left after its deletion:\n%s", k.MustKubectl("get", "replicaset,pod", "-l", "app=fleet"))
		}
		for _, id := range ids {
			if !harness.WaitFor(time.Minute, func() bool { return len(sandboxQEMU(id)) == 0 }) {
				t.Fatalf("QEMU of garbage-collected pod %s still runs", second)
			}
		}
	})

	t.Run("kubelet restart leaves pods running and managed", func(t *testing.T) {
		k := k.T(t)
		n0 := podCounter(t, k, "web")
		k.RestartKubelet(func() {
			// Without a kubelet the pod's VM runs on.
			time.Sleep(3 * time.Second)
			if out := execOut(t, k.CRI, k.MustCrictl("ps", "-q", "--name", "^web$", "--pod", k.MustCrictl("pods", "-q", "--name", "^web$")), "cat", "/dev/shm/n"); out == "" {
				t.Fatal("no counter without the kubelet")
			}
		})
		// The new kubelet takes the pod over from CRI; until then its
		// streaming endpoints do not know the pod.
		var out string
		if !harness.WaitFor(2*time.Minute, func() bool {
			o, _, err := k.Kubectl("exec", "web", "-c", "web", "--", "cat", "/dev/shm/n")
			out = strings.TrimSpace(o)
			return err == nil
		}) {
			t.Fatalf("kubectl exec web after the kubelet restart: %s", k.Cluster.LogTail("kubelet", 20))
		}
		n1, _ := strconv.Atoi(out)
		if n1 <= n0 {
			t.Fatalf("counter %d before the kubelet restart, %d after: the pod did not run on", n0, n1)
		}
		if b := k.Exec("web", "web", "cat", "/proc/sys/kernel/random/boot_id"); b != boot {
			t.Fatalf("guest boot id %s after the kubelet restart, was %s: the VM was replaced", b, boot)
		}
		if n := k.MustKubectl("get", "pod", "web", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"); n != "0" {
			t.Fatalf("restartCount %s after the kubelet restart", n)
		}
	})

	t.Run("containerd restart leaves pods running and managed", func(t *testing.T) {
		k := k.T(t)
		id := k.MustCrictl("pods", "-q", "--name", "^web$")
		qemu := sandboxQEMU(id)
		if err := k.RestartContainerd(); err != nil {
			t.Fatal(err)
		}
		if q := sandboxQEMU(id); len(q) != 1 || len(qemu) != 1 || q[0] != qemu[0] {
			t.Fatalf("QEMU of pod web %v before the containerd restart, %v after", qemu, q)
		}
		var out string
		if !harness.WaitFor(2*time.Minute, func() bool {
			o, _, err := k.Kubectl("exec", "web", "-c", "web", "--", "cat", "/proc/sys/kernel/random/boot_id")
			out = strings.TrimSpace(o)
			return err == nil
		}) {
			t.Fatalf("kubectl exec web after the containerd restart: %s\n%s", out, k.LogTail(20))
		}
		if out != boot {
			t.Fatalf("guest boot id %s after the containerd restart, was %s", out, boot)
		}
		if n := k.MustKubectl("get", "pod", "web", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"); n != "0" {
			t.Fatalf("restartCount %s after the containerd restart", n)
		}
	})

	t.Run("delete leaves no qemu, mount or netns", func(t *testing.T) {
		k := k.T(t)
		id := k.MustCrictl("pods", "-q", "--name", "^web$")
		netns := k.MustCrictl("inspectp", "-o", "go-template", "--template",
			`{{range .info.runtimeSpec.linux.namespaces}}{{if eq .type "network"}}{{.path}}{{end}}{{end}}`, id)
		if netns == "" {
			t.Fatal("no network namespace path in the sandbox's spec")
		}
		deleteAndCheck(t, k, "web")
		// The kubelet's garbage collection removes the sandbox (every minute).
		if !harness.WaitFor(150*time.Second, func() bool {
			out, _, err := k.Crictl("pods", "-q", "--name", "^web$")
			return err == nil && strings.TrimSpace(out) == ""
		}) {
			out, _, _ := k.Crictl("pods")
			t.Fatalf("sandbox of pod web still in CRI after kubectl delete:\n%s", out)
		}
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(mounts), "\n") {
			if strings.Contains(l, id) || strings.Contains(l, netns) {
				t.Fatalf("mount of the deleted pod left: %s", l)
			}
		}
		if _, err := os.Stat(netns); err == nil {
			t.Fatalf("network namespace file %s left", netns)
		}
	})
}

// deleteAndCheck deletes a pod through the API server and checks that the
// kubelet stopped its sandboxes: each one NotReady, no QEMU of theirs.
// (Removing them is the kubelet's garbage collection, once a minute.)
func deleteAndCheck(t *testing.T, k *harness.K8s, pod string) {
	t.Helper()
	ids := strings.Fields(k.MustCrictl("pods", "-q", "--name", "^"+pod+"$"))
	k.MustKubectl("delete", "pod", pod, "--wait=true", "--timeout=120s")
	for _, id := range ids {
		if !harness.WaitFor(60*time.Second, func() bool {
			st, _, err := k.Crictl("inspectp", "-o", "go-template", "--template", "{{.status.state}}", id)
			return len(sandboxQEMU(id)) == 0 && (err != nil || strings.TrimSpace(st) == "SANDBOX_NOTREADY")
		}) {
			t.Fatalf("pod %s (sandbox %s) not stopped after kubectl delete: QEMU %v", pod, id, sandboxQEMU(id))
		}
	}
}

// logOverhead logs what the pod's VM costs beyond its guest RAM: QEMU's
// resident memory other than the guest RAM file (shared memory), and the
// shim's, against the RuntimeClass's overhead.podFixed.memory.
func logOverhead(t *testing.T, k *harness.K8s, pod string) {
	t.Helper()
	id := k.MustCrictl("pods", "-q", "--name", "^"+pod+"$")
	q := sandboxQEMU(id)
	shim := stack.ProcsMatching("containerd-shim-cryo-v2", id)
	if len(q) != 1 || len(shim) != 1 {
		t.Fatalf("pod %s: QEMU %v, shim %v", pod, q, shim)
	}
	qs, ss := procStatus(t, q[0]), procStatus(t, shim[0])
	over := qs["RssAnon"] + qs["RssFile"] + ss["VmRSS"]
	t.Logf("pod %s: QEMU RssAnon %d MiB, RssFile %d MiB, RssShmem (guest RAM) %d MiB; shim VmRSS %d MiB; overhead beyond guest RAM %d MiB",
		pod, qs["RssAnon"]>>10, qs["RssFile"]>>10, qs["RssShmem"]>>10, ss["VmRSS"]>>10, over>>10)
}

// procStatus reads the kB fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[2] == "kB" {
			m[strings.TrimSuffix(f[0], ":")], _ = strconv.Atoi(f[1])
		}
	}
	return m
}

// sandboxQEMU is the QEMU of a CRI sandbox: its command line names the
// sandbox's state dir, which is named by a hash of namespace/id.
func sandboxQEMU(id string) []int {
	sum := sha256.Sum256([]byte(harness.CRINamespace + "/" + id))
	return stack.ProcsMatching("qemu-system", "/vm/"+hex.EncodeToString(sum[:8]))
}

// podCounter reads the counter k8sCounter writes (by rename, so a read
// never sees it half written).
func podCounter(t *testing.T, k *harness.K8s, pod string) int {
	t.Helper()
	out := k.Exec(pod, "web", "cat", "/dev/shm/n")
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("counter of pod %s: %q is not a number", pod, out)
	}
	return n
}

// fleetPod waits for a Ready pod of deployment fleet other than not and
// returns its name.
func fleetPod(t *testing.T, k *harness.K8s, not string) string {
	t.Helper()
	var name string
	if !harness.WaitFor(3*time.Minute, func() bool {
		out, _, _ := k.Kubectl("get", "pod", "-l", "app=fleet", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] != not && f[1] == "True" {
				name = f[0]
				return true
			}
		}
		return false
	}) {
		out, _, _ := k.Kubectl("describe", "pod", "-l", "app=fleet")
		t.Fatalf("no Ready pod of deployment fleet (other than %q):\n%s\nscheduler:\n%s\ncontroller manager:\n%s", not, out,
			k.Cluster.LogTail("kube-scheduler", 10), k.Cluster.LogTail("kube-controller-manager", 10))
	}
	return name
}

// readonlyVolumes: a Secret volume and the service-account token (a
// projected volume, as the ServiceAccount admission plugin would add) are
// read-only in the container, as the kubelet mounts them; an emptyDir is
// writable.
func readonlyVolumes(t *testing.T, k *harness.K8s) {
	k.Apply(map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}})
	k.Apply(map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "creds"},
		"stringData": map[string]any{"password": "s3cret"}})
	const tokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	c := harness.Container("vols", "sleep inf")
	c["volumeMounts"] = []map[string]any{
		{"name": "creds", "mountPath": "/etc/creds"},
		{"name": "token", "mountPath": tokenDir, "readOnly": true},
		{"name": "scratch", "mountPath": "/scratch"},
	}
	pod := harness.Pod("vols", nil, c)
	spec := pod["spec"].(map[string]any)
	spec["serviceAccountName"], spec["automountServiceAccountToken"] = "default", false
	spec["volumes"] = []map[string]any{
		{"name": "creds", "secret": map[string]any{"secretName": "creds"}},
		{"name": "token", "projected": map[string]any{"sources": []map[string]any{
			{"serviceAccountToken": map[string]any{"path": "token", "expirationSeconds": 3600}},
		}}},
		{"name": "scratch", "emptyDir": map[string]any{}},
	}
	k.Apply(pod)
	k.WaitReady("vols", time.Now(), 3*time.Minute)
	if got := k.Exec("vols", "vols", "cat", "/etc/creds/password"); got != "s3cret" {
		t.Fatalf("secret in the container = %q", got)
	}
	token := k.Exec("vols", "vols", "cat", tokenDir+"/token")
	if !strings.HasPrefix(token, "eyJ") {
		t.Fatalf("service-account token in the container = %.40q", token)
	}
	for _, write := range []string{
		"echo x > /etc/creds/password", "echo x > /etc/creds/new", "rm -f /etc/creds/password",
		"echo x > " + tokenDir + "/token", "touch " + tokenDir + "/new",
	} {
		out, errs, err := k.Kubectl("exec", "vols", "-c", "vols", "--", "sh", "-c", write)
		if err == nil || !strings.Contains(out+errs, "Read-only file system") {
			t.Errorf("%q: %v %q %q, want Read-only file system", write, err, out, errs)
		}
	}
	if got := k.Exec("vols", "vols", "cat", "/etc/creds/password", tokenDir+"/token"); got != "s3cret"+token {
		t.Errorf("secret and token after the writes = %.60q", got)
	}
	if got := k.Exec("vols", "vols", "sh", "-c", "echo w > /scratch/f && cat /scratch/f"); got != "w" {
		t.Errorf("emptyDir write = %q", got)
	}
	deleteAndCheck(t, k, "vols")
}
