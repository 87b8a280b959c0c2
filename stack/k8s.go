package stack

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/flock"
)

// K8sOptions say where a one-node control plane runs: in the network
// namespace of a Stack's containerd (with CRI), so that 127.0.0.1 is the
// same for etcd, the API server, the kubelet and containerd's streaming
// server, and nothing listens on the host's network.
type K8sOptions struct {
	Dir       string // state, logs, credentials (a Stack's Dir)
	NetNS     string // the network namespace's path (/run/netns/NAME)
	CRISocket string // containerd's socket, serving CRI
	Tools     string // kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd under bin/ ($CRYO_TOOLS)
	// NodeIP is added as a /32 to lo of NetNS: the kubelet refuses a
	// loopback node IP, and the API server reaches the kubelet there.
	NodeIP   string
	NodeName string
	// CgroupRoot, when set, is the kubelet's cgroupRoot: the cgroup the
	// pods of runtimes that use cgroups (runc) are put below, named so that
	// cleanup finds it (Stack.CgroupRoot).
	CgroupRoot string
}

// K8s is a one-node cluster for one Stack: etcd, kube-apiserver,
// kube-controller-manager (Deployments, ReplicaSets, garbage collection),
// kube-scheduler and a kubelet. Close stops them and undoes what the kubelet
// changes on the host: global sysctls and directories outside its root dir.
type K8s struct {
	Dir        string
	NetNS      string
	NodeIP     string
	NodeName   string
	Kubeconfig string
	Token      string // the admin's bearer token (system:masters)
	Tools      string
	// CA is the PEM certificate of the cluster's CA, which signed the API
	// server's serving certificate (for 127.0.0.1, NodeIP and the
	// kubernetes Service's names) and which pods get as kube-root-ca.crt.
	CA []byte

	cgroupRoot string
	path       string
	procs      map[string]*proc
	undo       []func() error // host changes, undone last first
}

// Sysctls the kubelet sets for itself (pkg/kubelet/cm's setupKernelTunables)
// though they are global, not per network namespace.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Paths the kubelet creates whatever its --root-dir says.
var kubeletHostPaths = []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers"}

// StartK8s starts etcd, kube-apiserver, the controller manager, the
// scheduler and the kubelet and waits until the
// node is Ready and labelled cryo.dev/runtime=true (what the RuntimeClass's
// nodeSelector asks for). On error everything is stopped and undone.
func StartK8s(ctx context.Context, o K8sOptions) (_ *K8s, retErr error) {
	k := &K8s{
		Dir: filepath.Join(o.Dir, "k8s"), NetNS: o.NetNS, NodeIP: o.NodeIP, NodeName: o.NodeName,
		Tools: ToolsDir(o.Tools), procs: map[string]*proc{}, cgroupRoot: o.CgroupRoot,
	}
	k.path = filepath.Join(k.Tools, "bin") + ":" + os.Getenv("PATH")
	if err := Need(k.path, "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "nsenter", "ip"); err != nil {
		return nil, fmt.Errorf("%w (hack/tools.sh k8s etcd)", err)
	}
	defer func() {
		if retErr != nil {
			_ = k.Close()
		}
	}()
	if err := k.lockHost(ctx, HostLock); err != nil {
		return nil, err
	}
	k.saveHost()
	for _, d := range []string{"logs", "etcd", "kubelet", "pod-logs", "apiserver-certs"} {
		if err := os.MkdirAll(filepath.Join(k.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if out, err := k.inNetNS(ctx, "ip", "addr", "replace", o.NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("node ip on lo: %w: %s", err, out)
	}
	if err := k.writeCredentials(); err != nil {
		return nil, err
	}
	if err := makeCgroups(o.CgroupRoot); err != nil {
		return nil, err
	}
	if err := k.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := k.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := k.startControlLoops(ctx); err != nil {
		return nil, err
	}
	if err := k.StartKubelet(ctx, o.CRISocket); err != nil {
		return nil, err
	}
	// kubectl wait fails at once on a node the kubelet has not registered
	// yet: wait for the object first, then for its Ready condition.
	if _, err := k.KubectlOK(ctx, "wait", "--for=create", "node/"+k.NodeName, "--timeout=120s"); err != nil {
		return nil, fmt.Errorf("node %s not registered: %w\nkubelet log:\n%s", k.NodeName, err, k.LogTail("kubelet", 30))
	}
	if _, err := k.KubectlOK(ctx, "wait", "--for=condition=Ready", "node/"+k.NodeName, "--timeout=120s"); err != nil {
		return nil, fmt.Errorf("node %s not ready: %w\nkubelet log:\n%s", k.NodeName, err, k.LogTail("kubelet", 30))
	}
	if _, err := k.KubectlOK(ctx, "label", "node", k.NodeName, "cryo.dev/runtime=true", "--overwrite"); err != nil {
		return nil, err
	}
	// ServiceAccount admission refuses a pod whose namespace has no
	// ServiceAccount default yet, and the kubelet holds it until
	// kube-root-ca.crt exists: the controller manager makes both.
	for _, obj := range []string{"serviceaccount/default", "configmap/kube-root-ca.crt"} {
		if _, err := k.KubectlOK(ctx, "wait", "--for=create", "-n", "default", obj, "--timeout=120s"); err != nil {
			return nil, fmt.Errorf("%s: %w\nkube-controller-manager log:\n%s", obj, err, k.LogTail("kube-controller-manager", 30))
		}
	}
	return k, nil
}

// makeCgroups creates root in every cgroup hierarchy before the kubelet
// starts: it reads the root's stats and limits from its first housekeeping
// on. cpuset needs its parent's cpus and mems before a task may join.
func makeCgroups(root string) error {
	if root == "" {
		return nil
	}
	hier, err := os.ReadDir(cgroupFS)
	if err != nil {
		return err
	}
	for _, h := range hier {
		d := filepath.Join(cgroupFS, h.Name(), root)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(cgroupFS, h.Name(), f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup root %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

// HostLock is the file a K8s holds locked from its start to its Close:
// the kubelet's host changes (global sysctls, /var/lib/kubelet with its
// fixed device-plugin socket) admit one control plane per machine at a
// time, so a second one, in another test process or a demo, waits.
const HostLock = "/run/cryo-k8s.lock"

// lockHost waits until this K8s holds the lock file path, or ctx ends;
// Close releases it last.
func (k *K8s) lockHost(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("k8s host lock: %w", err)
	}
	if err := flock.Wait(ctx, f, unix.LOCK_EX); err != nil {
		f.Close()
		return fmt.Errorf("waiting for another control plane on this machine to end: %w", err)
	}
	k.undo = append(k.undo, f.Close) // closing the descriptor unlocks
	return nil
}

// saveHost records what Close must put back: the sysctls' values and which
// of the kubelet's host paths did not exist.
func (k *K8s) saveHost() {
	for _, s := range kubeletSysctls {
		p := "/proc/sys/" + s
		if v, err := os.ReadFile(p); err == nil {
			k.undo = append(k.undo, func() error { return os.WriteFile(p, v, 0o644) })
		}
	}
	for _, p := range kubeletHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			k.undo = append(k.undo, func() error { return os.RemoveAll(p) })
		}
	}
	// Links the kubelet made to this control plane's pod logs, in a
	// /var/log/containers that was there before.
	k.undo = append(k.undo, func() error { removeLinksInto("/var/log/containers", k.Dir); return nil })
}

func removeLinksInto(dir, target string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, target+"/") {
			_ = os.Remove(p)
		}
	}
}

// writeCredentials writes the service-account key pair, the admin token,
// the kubeconfig everything on the node uses (token auth; the API server's
// certificate is not verified on 127.0.0.1) and the API server's
// certificate, signed by a CA of the cluster's own: pods verify it through
// kube-root-ca.crt when they reach the API server at NodeIP.
func (k *K8s) writeCredentials() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	k.Token = hex.EncodeToString(tok)
	k.Kubeconfig = filepath.Join(k.Dir, "kubeconfig")
	ca, serving, servingKey, err := apiServerCerts(k.NodeIP)
	if err != nil {
		return err
	}
	k.CA = ca
	files := map[string][]byte{
		"sa.key":                     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":                     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv":                 []byte(k.Token + ",admin,admin-uid,\"system:masters\"\n"),
		"kubeconfig":                 []byte(fmt.Sprintf(kubeconfig, k.Token)),
		"apiserver-certs/ca.crt":     ca,
		"apiserver-certs/server.crt": serving,
		"apiserver-certs/server.key": servingKey,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(k.Dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// kubernetesServiceIP is the kubernetes Service's address: the first of
// --service-cluster-ip-range. Nothing routes it (no kube-proxy), but
// clients that dial it by name check it in the certificate.
const kubernetesServiceIP = "10.96.0.1"

// apiServerCerts makes a CA and a serving certificate it signs, valid for
// every address and name a client of the API server may use, as PEM.
func apiServerCerts(nodeIP string) (caPEM, certPEM, keyPEM []byte, _ error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cryo-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(nodeIP), net.ParseIP(kubernetesServiceIP)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "%s"}
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
`

func (k *K8s) startEtcd(ctx context.Context) error {
	if err := k.start("etcd", "--name", "k8s", "--data-dir", filepath.Join(k.Dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "k8s=http://127.0.0.1:2380", "--initial-cluster-state", "new"); err != nil {
		return err
	}
	return k.waitHTTP(ctx, "etcd", "http://127.0.0.1:2379/health", 60*time.Second)
}

func (k *K8s) startAPIServer(ctx context.Context) error {
	d := k.Dir
	if err := k.start("kube-apiserver",
		"--etcd-servers=http://127.0.0.1:2379",
		// Every address of the private network namespace: 127.0.0.1 for
		// kubectl and the node's parts, NodeIP for pods (the kubernetes
		// Service's endpoint; there is no kube-proxy for its ClusterIP).
		"--bind-address=0.0.0.0", "--secure-port=6443", "--advertise-address="+k.NodeIP,
		"--tls-cert-file="+filepath.Join(d, "apiserver-certs", "server.crt"),
		"--tls-private-key-file="+filepath.Join(d, "apiserver-certs", "server.key"),
		"--service-account-key-file="+filepath.Join(d, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(d, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--token-auth-file="+filepath.Join(d, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		// Admission webhooks (and aggregated APIs) are called at their
		// Service's endpoint, a pod's address: there is no kube-proxy to
		// route the ClusterIP.
		"--enable-aggregator-routing=true",
		"--service-cluster-ip-range=10.96.0.0/24",
		// By default it dials the node by host name, which nothing resolves.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true"); err != nil {
		return err
	}
	return k.waitHTTP(ctx, "kube-apiserver", "https://127.0.0.1:6443/readyz", 180*time.Second)
}

// startControlLoops starts kube-controller-manager and kube-scheduler with
// the admin's credentials, serving their health checks on 127.0.0.1 only.
// No leader election: each runs once per cluster.
func (k *K8s) startControlLoops(ctx context.Context) error {
	d := k.Dir
	if err := k.start("kube-controller-manager",
		"--kubeconfig="+k.Kubeconfig,
		"--authentication-kubeconfig="+k.Kubeconfig, "--authorization-kubeconfig="+k.Kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(d, "sa.key"),
		// Published to every namespace as kube-root-ca.crt, which
		// projected service-account tokens carry.
		"--root-ca-file="+filepath.Join(d, "apiserver-certs", "ca.crt"),
		"--cluster-name=cryo-test"); err != nil {
		return err
	}
	if err := k.waitHTTP(ctx, "kube-controller-manager", "https://127.0.0.1:10257/healthz", 120*time.Second); err != nil {
		return err
	}
	if err := k.start("kube-scheduler",
		"--kubeconfig="+k.Kubeconfig,
		"--authentication-kubeconfig="+k.Kubeconfig, "--authorization-kubeconfig="+k.Kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false"); err != nil {
		return err
	}
	return k.waitHTTP(ctx, "kube-scheduler", "https://127.0.0.1:10259/healthz", 120*time.Second)
}

// StartKubelet starts (or, after StopKubelet, restarts) the kubelet on
// containerd's CRI socket.
func (k *K8s) StartKubelet(ctx context.Context, criSocket string) error {
	cfg := filepath.Join(k.Dir, "kubelet-config.yaml")
	y := fmt.Sprintf(kubeletConfig, criSocket, criSocket, filepath.Join(k.Dir, "pod-logs"), filepath.Join(k.Dir, "kubelet", "volume-plugins"))
	if k.cgroupRoot != "" {
		y += "cgroupRoot: " + k.cgroupRoot + "\n"
	}
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		return err
	}
	if err := k.start("kubelet", "--config="+cfg, "--kubeconfig="+k.Kubeconfig,
		"--root-dir="+filepath.Join(k.Dir, "kubelet"), "--cert-dir="+filepath.Join(k.Dir, "kubelet", "pki"),
		"--hostname-override="+k.NodeName, "--node-ip="+k.NodeIP, "--v=2"); err != nil {
		return err
	}
	return k.waitHTTP(ctx, "kubelet", "http://127.0.0.1:10248/healthz", 120*time.Second)
}

// The kubelet on a cgroup v1 host without systemd: no QoS cgroups, no node
// allocatable enforcement. Anonymous, always-allowed access to its API (on
// the test's own network namespace) lets the tests POST /checkpoint.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
runtimeRequestTimeout: 10m
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
podLogsDir: %s
volumePluginDir: %s
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
`

// StopKubelet stops the kubelet; the pods run on.
func (k *K8s) StopKubelet() { k.stop("kubelet") }

// start runs bin from the tools in the network namespace, logging to
// logs/NAME.log.
func (k *K8s) start(name string, args ...string) error {
	bin, err := LookPath(name, k.path)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(k.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + k.NetNS, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+k.path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	k.procs[name] = p
	return nil
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group of name, SIGKILL after 15 s.
func (k *K8s) stop(name string) {
	p := k.procs[name]
	if p == nil {
		return
	}
	delete(k.procs, name)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Close stops the kubelet, the control loops, the API server and etcd, and
// puts back the
// host's sysctls and paths. The pods are containerd's: the Stack's Close
// removes them.
func (k *K8s) Close() error {
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		k.stop(name)
	}
	var errs []error
	for i := len(k.undo) - 1; i >= 0; i-- {
		if err := k.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	k.undo = nil
	return errors.Join(errs...)
}

// LogTail is the last n lines of a component's log.
func (k *K8s) LogTail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(k.Dir, "logs", name+".log"))
	return LastLines(string(b), n)
}

func (k *K8s) inNetNS(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + k.NetNS}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+k.path)
	return cmd
}

// KubectlCmd is kubectl as the admin, in the network namespace; stdin
// can be set before it runs.
func (k *K8s) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	return k.inNetNS(ctx, append([]string{filepath.Join(k.Tools, "bin", "kubectl"), "--kubeconfig", k.Kubeconfig}, args...)...)
}

// Kubectl runs kubectl with a 3 minute deadline.
func (k *K8s) Kubectl(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := k.KubectlCmd(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("kubectl %s: timed out", strings.Join(args, " "))
	}
	return out.String(), errb.String(), err
}

// KubectlOK is Kubectl with its stderr in the error.
func (k *K8s) KubectlOK(ctx context.Context, args ...string) (string, error) {
	out, errs, err := k.Kubectl(ctx, args...)
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errs))
	}
	return strings.TrimSpace(out), nil
}

// HTTPClient reaches the network namespace's addresses (the kubelet's API
// on NodeIP:10250, the API server); it does not verify certificates.
func (k *K8s) HTTPClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
		DialContext:     dialInNetNS(k.NetNS),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
}

// DialInNetNS is a DialContext for an http.Transport that reaches the
// addresses of the network namespace at path (a CRI stack's pod network).
func DialInNetNS(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialInNetNS(path)
}

// dialInNetNS dials from a thread that has entered the namespace: a socket
// belongs to the namespace it was made in, wherever it is used later. The
// thread goes back to its own namespace before it is unlocked. It must not
// be left to die locked: the processes the Stack starts have Pdeathsig set,
// which fires when the thread that forked them exits, and any thread may
// have.
func dialInNetNS(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			c, back, err := dialFromThread(ctx, path, network, addr)
			if back {
				runtime.UnlockOSThread()
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// dialFromThread dials in path's namespace from the locked thread; back says
// whether the thread is in its own namespace again.
func dialFromThread(ctx context.Context, path, network, addr string) (_ net.Conn, back bool, _ error) {
	own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, err
	}
	defer own.Close()
	target, err := os.Open(path)
	if err != nil {
		return nil, true, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("enter %s: %w", path, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	return c, unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil, err
}

// waitHTTP polls url (in the namespace) until it answers 200.
func (k *K8s) waitHTTP(ctx context.Context, name, url string, timeout time.Duration) error {
	c := k.HTTPClient()
	c.Timeout = 5 * time.Second
	deadline := time.Now().Add(timeout)
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+k.Token)
		resp, err := c.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, b)
		} else {
			last = err.Error()
		}
		if p := k.procs[name]; p != nil && p.exited() {
			return fmt.Errorf("%s exited:\n%s", name, k.LogTail(name, 30))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer at %s within %s (%s):\n%s", name, url, timeout, last, k.LogTail(name, 30))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
