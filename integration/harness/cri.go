package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/internal/busybox"
	"github.com/cryo-runtime/cryo/stack"
)

// CRINamespace is the containerd namespace CRI keeps its images and
// containers in.
const CRINamespace = "k8s.io"

// PauseImage is the pinned sandbox image of a CRI Env: the busybox test
// image sleeping forever.
const PauseImage = "cryo.local/pause:1"

// RuntimeHandler is the CRI runtime handler (RuntimeClass handler) of cryo.
const RuntimeHandler = "cryo"

// CRI is a private containerd with its CRI plugin, the cryo runtime handler
// and a CNI bridge network. containerd runs in a network namespace of the
// test's own, so the CNI bridge, its addresses and whatever the bridge
// plugin sets up live and die with the test; crictl runs there too (the
// streaming server listens on that namespace's 127.0.0.1).
type CRI struct {
	*Env
	NetNSName    string // the namespace containerd, its bridge and crictl run in
	NetNS        string // its path
	Bridge       string // the CNI bridge
	Subnet       string // the pods' subnet, e.g. "10.88.123.0/24"
	Gateway      string // the bridge's address: the host end of the pod network
	CrictlConfig string
	// RegistryHosts, when set before start, is a directory of containerd
	// hosts.toml files (config_path) for image pulls.
	RegistryHosts string
	// Pause, when set before start, is the pinned sandbox image (its Name)
	// instead of PauseImage running `sleep inf`.
	Pause *busybox.Spec
	// SandboxImage is the pinned sandbox image's name (PauseImage or
	// Pause.Name).
	SandboxImage string
	// DrainExecSyncIOTimeout, when set before start, is CRI's
	// drain_exec_sync_io_timeout.
	DrainExecSyncIOTimeout string
	// MaxContainerLogLineSize, when set before start, is CRI's
	// max_container_log_line_size.
	MaxContainerLogLineSize int
	// ShimSocketDir, when set before start, is the shim manager's
	// socket_dir (stack.Options.ShimSocketDir). Start creates it if needed
	// and cleanup removes it again if it created it and it is empty.
	ShimSocketDir string
	// IPAMDir, when set before start, is host-local's dataDir instead of
	// one under Env.Dir (tests that look for the pod's address in
	// /var/lib/cni set "/var/lib/cni/networks"); cleanup removes the
	// network's directory there.
	IPAMDir string
	// Runc, when set before start, adds the runtime handler "runc"
	// (stack.CRIConfig.RuncRoot) for pods that run without a VM.
	Runc bool

	lastPods []string // the pods cleanup found (removePods)
}

// StartCRI starts a private containerd with CRI enabled. Cleanup removes
// every pod (and so every VM), stops containerd, and deletes the network
// namespace with the bridge in it; IPAM data and pod netns mounts live
// under Env.Dir and go with it.
func StartCRI(t testing.TB, opts ...Option) *CRI {
	t.Helper()
	return StartCRIWith(t, &CRI{}, opts...)
}

// StartCRIWith is StartCRI with fields of c (RegistryHosts) preset.
func StartCRIWith(t testing.TB, c *CRI, opts ...Option) *CRI {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("integration tests start containerd and QEMU and must run as root")
	}
	Need(t, os.Getenv("PATH"), "nsenter", "ip")
	x := 100 + rand.IntN(150)
	c.NetNSName = fmt.Sprintf("cryo-cri-%d-%d", os.Getpid(), x)
	c.NetNS = "/run/netns/" + c.NetNSName
	c.Bridge = fmt.Sprintf("cryobr%d", x)
	c.Subnet = fmt.Sprintf("10.88.%d.0/24", x)
	c.Gateway = fmt.Sprintf("10.88.%d.1", x)
	if out, err := exec.Command("ip", "netns", "add", c.NetNSName).CombinedOutput(); err != nil {
		t.Fatalf("create netns: %v: %s", err, out)
	}
	// Registered first, so it runs last: after containerd and the pods.
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", c.NetNSName).Run() })
	if out, err := exec.Command("ip", "-n", c.NetNSName, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in netns: %v: %s", err, out)
	}
	c.SandboxImage = c.pauseSpec().Name
	for _, d := range []string{c.ShimSocketDir, c.IPAMDir} {
		if d != "" {
			mkdirAllCleanup(t, d)
		}
	}
	if c.ShimSocketDir != "" {
		removeStaleSockets(t, c.ShimSocketDir)
	}
	if c.IPAMDir != "" {
		t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(c.IPAMDir, c.NetNSName)) })
	}
	// Registered before containerd's: it runs once containerd has stopped.
	t.Cleanup(func() { c.checkCNICache(t) })
	c.Env = start(t, stack.Options{Namespace: CRINamespace, NetNS: c.NetNS, ContainerdConfig: c.containerdConfig, ShimSocketDir: c.ShimSocketDir}, opts...)
	t.Cleanup(c.removePods)
	Need(t, c.Path(), "crictl", "bridge", "host-local", "loopback")

	pause := filepath.Join(c.Dir, "pause.tar")
	if err := busybox.WriteSpecFile(pause, c.pauseSpec()); err != nil {
		t.Fatal(err)
	}
	c.MustCtr("image", "import", pause)
	c.CrictlConfig = filepath.Join(c.Dir, "crictl.yaml")
	crictl := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 120\ndebug: false\n", c.Socket, c.Socket)
	if err := os.WriteFile(c.CrictlConfig, []byte(crictl), 0o644); err != nil {
		t.Fatal(err)
	}
	// CRI learns of imported images through events: wait until it lists them.
	if !WaitFor(30*time.Second, func() bool {
		out, _, err := c.Crictl("images", "-q")
		return err == nil && len(strings.Fields(out)) >= 2
	}) {
		out, errs, _ := c.Crictl("images")
		t.Fatalf("CRI does not list the test images: %s %s\n%s", out, errs, c.LogTail(30))
	}
	return c
}

// pauseSpec is the pinned sandbox image: c.Pause, else PauseImage.
func (c *CRI) pauseSpec() busybox.Spec {
	if c.Pause != nil {
		return *c.Pause
	}
	return busybox.Spec{Name: PauseImage, Cmd: []string{"sleep", "inf"}}
}

// mkdirAllCleanup creates dir and whichever of its parents are missing, and
// removes those again after the test when they are empty.
func mkdirAllCleanup(t testing.TB, dir string) {
	var created []string
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range created { // deepest first
			_ = os.Remove(d)
		}
	})
}

// removeStaleSockets removes, after the test, the sockets that appeared in
// dir during it and that nothing listens on any more: a shim killed with
// SIGKILL leaves its socket behind. A socket another containerd's shim
// still serves is left alone.
func removeStaleSockets(t testing.TB, dir string) {
	before := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		before[e.Name()] = true
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if before[e.Name()] || e.Type()&os.ModeSocket == 0 {
				continue
			}
			if conn, err := net.DialTimeout("unix", p, time.Second); err == nil {
				conn.Close()
				continue
			}
			_ = os.Remove(p)
		}
	})
}

// containerdConfig is the stack's version 3 config plus CRI, the cryo
// handler and the CNI network. No [plugins."io.containerd.runtime.v2.task"] section: in
// a version 3 config it wipes the shim manager's socket_dir.
func (c *CRI) containerdConfig(e *stack.Stack, scratch string) (string, error) {
	netd := filepath.Join(e.Dir, "net.d")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		return "", err
	}
	ipam := filepath.Join(e.Dir, "ipam")
	if c.IPAMDir != "" {
		ipam = c.IPAMDir
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       c.NetNSName, // this Env's own: what CNI keeps on the host is named after it
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": c.Bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type": "host-local", "dataDir": ipam,
				"ranges": [][]map[string]string{{{"subnet": c.Subnet}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	if err := os.WriteFile(filepath.Join(netd, "10-cryo.conflist"), b, 0o644); err != nil {
		return "", err
	}
	tools := os.Getenv("CRYO_TOOLS")
	if tools == "" {
		tools = "/var/cache/cryo/tools"
	}
	tools = filepath.Join(tools, "bin") // the CNI plugins
	cri := stack.CRIConfig{
		PauseImage: c.SandboxImage, RegistryHosts: c.RegistryHosts, CryoConfig: e.ConfigPath, CNIBinDir: tools, CNIConfDir: netd,
		DrainExecSyncIOTimeout: c.DrainExecSyncIOTimeout, MaxContainerLogLineSize: c.MaxContainerLogLineSize,
	}
	if c.Runc {
		cri.RuncRoot = filepath.Join(e.Dir, "runc")
	}
	return e.ContainerdConfig(scratch) + cri.TOML(), nil
}

// CrictlCmd is crictl against this containerd, run in its network
// namespace; for commands that stream (attach, logs -f).
func (c *CRI) CrictlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.NetNS, "crictl", "--config", c.CrictlConfig}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+c.Path())
	return cmd
}

// Crictl runs crictl with a 3 minute deadline.
func (c *CRI) Crictl(args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := c.CrictlCmd(ctx, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("crictl %s: timed out", strings.Join(args, " "))
	}
	return out.String(), errb.String(), err
}

// MustCrictl runs crictl and fails the test on error; it returns stdout
// with surrounding white space trimmed.
func (c *CRI) MustCrictl(args ...string) string {
	c.t.Helper()
	out, errs, err := c.Crictl(args...)
	if err != nil {
		c.t.Fatalf("crictl %s: %v\nstdout: %s\nstderr: %s\ncontainerd log:\n%s", strings.Join(args, " "), err, out, errs, c.LogTail(30))
	}
	return strings.TrimSpace(out)
}

// CrictlTTY runs crictl at a terminal (AtTerminal), as `crictl exec -it`
// needs.
func (c *CRI) CrictlTTY(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.Command("nsenter", append([]string{"--net=" + c.NetNS, "crictl", "--config", c.CrictlConfig}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+c.Path())
	out, err := stack.AtTerminal(ctx, cmd).CombinedOutput()
	return string(out), err
}

// InNetNS runs a command in containerd's network namespace: the host end of
// the pod network (the bridge).
func (c *CRI) InNetNS(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.NetNS}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+c.Path())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// PodConfig writes a CRI PodSandboxConfig for a pod called name and returns
// its path.
func (c *CRI) PodConfig(name string, annotations map[string]string) string {
	c.t.Helper()
	return c.PodConfigLinux("default", name, annotations, map[string]any{})
}

// PodConfigIn is PodConfig for a pod in Kubernetes namespace ns.
func (c *CRI) PodConfigIn(ns, name string, annotations map[string]string) string {
	c.t.Helper()
	return c.PodConfigLinux(ns, name, annotations, map[string]any{})
}

// PodConfigLinux is PodConfigIn with the pod's LinuxPodSandboxConfig (its
// resources, as the kubelet sends them, for example).
func (c *CRI) PodConfigLinux(ns, name string, annotations map[string]string, linux map[string]any) string {
	c.t.Helper()
	return c.writeJSON("pod-"+name+".json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": ns, "uid": name + "-uid", "attempt": 1},
		"hostname":      name,
		"log_directory": filepath.Join(c.Dir, "logs", name),
		"annotations":   annotations,
		"linux":         linux,
	})
}

// ContainerConfig writes a CRI ContainerConfig running args in the busybox
// test image and returns its path; its log is <pod log dir>/<name>.log.
// extra's keys are set on the config as they are (annotations, stdin, tty,
// ...).
func (c *CRI) ContainerConfig(name string, args []string, extra map[string]any) string {
	c.t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": Image},
		"command":  args,
		"log_path": name + ".log",
		"linux":    map[string]any{},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return c.writeJSON("ctr-"+name+".json", cfg)
}

func (c *CRI) writeJSON(name string, v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		c.t.Fatal(err)
	}
	p := filepath.Join(c.Dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// RunPod runs a pod with the cryo handler and returns its id.
func (c *CRI) RunPod(podConfig string) string {
	c.t.Helper()
	return c.MustCrictl("runp", "--runtime", RuntimeHandler, podConfig)
}

// StartContainer creates and starts a container in a pod and returns its id.
func (c *CRI) StartContainer(pod, ctrConfig, podConfig string) string {
	c.t.Helper()
	id := c.MustCrictl("create", pod, ctrConfig, podConfig)
	c.MustCrictl("start", id)
	return id
}

// cniCacheDir is where libcni keeps the result of each pod's network
// setup (<network>-<pod id>-<interface>): containerd's CRI plugin (through
// go-cni) cannot move it.
const cniCacheDir = "/var/lib/cni/results"

// checkCNICache fails the test with the CNI results of this Env's pods left
// on the host after containerd stopped, and removes them. containerd
// removes a pod's results when it tears the pod's network down, so one left
// is a pod that was never stopped. Only this Env's can be counted: its
// network is named after NetNSName, which no other Env shares, and the
// loopback network's results (cni-loopback-<pod id>-lo) are looked up by
// the ids of the pods cleanup found, random 64-digit hex.
func (c *CRI) checkCNICache(t testing.TB) {
	left, _ := filepath.Glob(filepath.Join(cniCacheDir, c.NetNSName+"-*"))
	for _, id := range c.lastPods {
		if len(id) < 12 || strings.Trim(id, "0123456789abcdef") != "" {
			continue
		}
		m, _ := filepath.Glob(filepath.Join(cniCacheDir, "*-"+id+"*"))
		for _, p := range m {
			if !slices.Contains(left, p) {
				left = append(left, p)
			}
		}
	}
	for _, p := range left {
		_ = os.Remove(p)
	}
	if len(left) > 0 {
		t.Errorf("after the test: CNI results left on the host (removed): %s", strings.Join(left, " "))
	}
}

// removePods stops and removes every pod while containerd still runs, so
// the shims shut their VMs down and CNI releases the addresses.
func (c *CRI) removePods() {
	if c.Env == nil {
		return
	}
	out, _, err := c.Crictl("pods", "-q")
	if err != nil {
		return
	}
	c.lastPods = strings.Fields(out)
	for _, id := range c.lastPods {
		_, _, _ = c.Crictl("stopp", id)
		_, _, _ = c.Crictl("rmp", "-f", id)
	}
}

// RegistryAddr is where StartRegistry serves, inside the CRI Env's network
// namespace (which is the test's own, so the port is free).
const RegistryAddr = "127.0.0.1:5000"

// RegistryHostsDir writes a containerd hosts directory (config_path) that
// pulls from RegistryAddr over plain HTTP, for StartCRIWith.
func RegistryHostsDir(t testing.TB) string {
	dir := t.TempDir()
	d := filepath.Join(dir, RegistryAddr)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n", RegistryAddr, RegistryAddr)
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// StartRegistry runs a distribution registry on RegistryAddr in the Env's
// network namespace (CRI pulls, e.g. critest's, need one) and pushes the
// test image to it as each of refs (repository paths under the registry).
func (c *CRI) StartRegistry(refs ...string) {
	c.t.Helper()
	Need(c.t, c.Path(), "registry")
	cfg := filepath.Join(c.Dir, "registry.yml")
	y := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(c.Dir, "registry"), RegistryAddr)
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		c.t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(c.Dir, "registry.log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", "--net="+c.NetNS, "registry", "serve", cfg)
	cmd.Env = append(os.Environ(), "PATH="+c.Path())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start registry: %v", err)
	}
	c.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !WaitFor(20*time.Second, func() bool {
		out, _ := c.InNetNS("busybox", "wget", "-q", "-O", "-", "http://"+RegistryAddr+"/v2/")
		return strings.Contains(out, "{}")
	}) {
		b, _ := os.ReadFile(filepath.Join(c.Dir, "registry.log"))
		c.t.Fatalf("registry did not come up on %s:\n%s", RegistryAddr, b)
	}
	for _, ref := range refs {
		c.Push(Image, ref)
	}
}

// Push pushes image, which containerd has, to the registry as ref (a
// repository path under RegistryAddr) and returns the full reference.
func (c *CRI) Push(image, ref string) string {
	c.t.Helper()
	full := RegistryAddr + "/" + ref
	if image != full {
		c.MustCtr("image", "tag", "--force", image, full)
	}
	if out, err := c.InNetNS("ctr", "-a", c.Socket, "-n", c.Namespace, "image", "push", "--plain-http", full); err != nil {
		c.t.Fatalf("push %s: %v\n%s", full, err, out)
	}
	return full
}
