package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/stack"
	"github.com/cryo-runtime/cryo/stores"
)

// NodeName is the K8s Env's node; pods name it (there is no scheduler).
const NodeName = "cryo-node"

// NodeIP is the node's address, on lo of the Env's network namespace.
const NodeIP = "10.250.0.1"

// S3Addr is where the K8s Env's versitygw listens, in its network
// namespace: the shims (containerd runs there) and the pods reach it.
const S3Addr = NodeIP + ":9000"

// K8s is a CRI Env with a one-node Kubernetes control plane (etcd,
// kube-apiserver, controller manager, scheduler, kubelet) on its containerd, in its network namespace,
// the RuntimeClasses cryo (from packaging/kubernetes) and runc (for pods
// without a VM, such as the controller's) applied, and an S3 store
// (versitygw on S3Addr, bucket "snapshots", which the node's [stores]
// allowed admits).
type K8s struct {
	*CRI
	Cluster *stack.K8s
	S3      *stack.S3Server
}

// StartK8s starts a CRI Env and the control plane on it. Cleanup stops
// the control plane (undoing the kubelet's host changes) before the CRI
// Env removes the pods and their VMs.
func StartK8s(t testing.TB, opts ...Option) *K8s {
	t.Helper()
	c := StartCRIWith(t, &CRI{Runc: true}, append([]Option{s3Node}, opts...)...)
	k, err := stack.StartK8s(t.Context(), stack.K8sOptions{
		Dir: c.Dir, NetNS: c.NetNS, CRISocket: c.Socket, Tools: c.Tools, NodeIP: NodeIP, NodeName: NodeName,
		CgroupRoot: c.CgroupRoot(),
	})
	if err != nil {
		t.Fatal(err)
	}
	x := &K8s{CRI: c, Cluster: k}
	t.Cleanup(func() {
		if t.Failed() {
			ctx := context.WithoutCancel(t.Context())
			pods, _, _ := k.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
			events, _, _ := k.Kubectl(ctx, "get", "events", "-A", "--sort-by=.lastTimestamp")
			t.Logf("dump of the pods, events and kubelet log:\npods:\n%s\nevents:\n%s\nkubelet log:\n%s", pods, events, k.LogTail("kubelet", 40))
		}
		if keep := os.Getenv("CRYO_KEEP_LOG"); keep != "" {
			// for debugging: keep the kubelet's log beside containerd's
			if b, err := os.ReadFile(filepath.Join(k.Dir, "logs", "kubelet.log")); err == nil {
				_ = os.WriteFile(keep+".kubelet", b, 0o600)
			}
		}
		if err := k.Close(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	// After the control plane: NodeIP is on lo from then on.
	x.S3 = startS3(t, c)
	x.MustKubectl("apply", "-f", filepath.Join(RepoRoot(t), "packaging", "kubernetes", "runtimeclass.yaml"))
	x.Apply(map[string]any{
		"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
		"metadata": map[string]any{"name": RuncHandler}, "handler": RuncHandler,
	})
	return x
}

// RuncHandler is the runtime handler and RuntimeClass of pods that run
// under runc, without a VM.
const RuncHandler = stack.RuncHandler

// The K8s Env's S3 credentials and bucket (stack.S3Server's).
const (
	s3AccessKey = "cryobench"
	s3SecretKey = "cryobench-secret-key"
	S3Bucket    = "snapshots"
	s3Region    = "us-east-1"
)

// s3Node points the node's S3 stores at the K8s Env's versitygw and allows
// each namespace its own directory under DefaultStore, where the
// controller's repositories are (<DefaultStore>/<namespace>/pods).
func s3Node(c *configs.Config) {
	c.Stores.S3 = configs.S3{Endpoint: S3Addr, AccessKey: s3AccessKey, SecretKey: s3SecretKey, Region: s3Region}
	c.Stores.Allowed = append(c.Stores.Allowed, DefaultStore+"/"+configs.NamespacePlaceholder+"/")
}

// startS3 runs versitygw in the CRI Env's network namespace on S3Addr
// until the test ends.
func startS3(t testing.TB, c *CRI) *stack.S3Server {
	t.Helper()
	s, err := stack.StartS3With(t.Context(), stack.S3Options{Tools: c.Tools, Dir: c.Dir, NetNS: c.NetNS, Addr: S3Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if s.AccessKey != s3AccessKey || s.SecretKey != s3SecretKey || s.Bucket != S3Bucket {
		t.Fatalf("versitygw's credentials are %s/%s/%s, the node's config says %s/%s/%s", s.AccessKey, s.SecretKey, s.Bucket, s3AccessKey, s3SecretKey, S3Bucket)
	}
	return s
}

// StoreOptions open the K8s Env's S3 store from the test (through its
// network namespace), as the node and the controller do.
func (k *K8s) StoreOptions() stores.Options {
	return stores.Options{
		S3: stores.S3Options{Endpoint: S3Addr, AccessKeyID: s3AccessKey, SecretAccessKey: s3SecretKey, Region: s3Region,
			UseSSL: new(bool)},
		HTTPClient: &http.Client{Transport: k.S3.Transport},
	}
}

// T is k bound to a subtest: its failures end t, not the test that
// started the cluster.
func (k *K8s) T(t testing.TB) *K8s {
	e := *k.Env
	e.t = t
	c := *k.CRI
	c.Env = &e
	return &K8s{CRI: &c, Cluster: k.Cluster, S3: k.S3}
}

// RestartKubelet stops the kubelet, runs between (with no kubelet), and
// starts it again on the same root dir, waiting until the node is Ready.
func (k *K8s) RestartKubelet(between func()) {
	k.t.Helper()
	k.Cluster.StopKubelet()
	between()
	if err := k.Cluster.StartKubelet(k.t.Context(), k.Socket); err != nil {
		k.t.Fatal(err)
	}
	k.MustKubectl("wait", "--for=condition=Ready", "node/"+NodeName, "--timeout=120s")
}

// Kubectl runs kubectl as the cluster's admin.
func (k *K8s) Kubectl(args ...string) (stdout, stderr string, err error) {
	return k.Cluster.Kubectl(k.t.Context(), args...)
}

// MustKubectl runs kubectl and fails the test on error; it returns stdout
// trimmed.
func (k *K8s) MustKubectl(args ...string) string {
	k.t.Helper()
	out, err := k.Cluster.KubectlOK(k.t.Context(), args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// Apply creates the object v (a pod, as a map) from its JSON.
func (k *K8s) Apply(v any) {
	k.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		k.t.Fatal(err)
	}
	cmd := k.Cluster.KubectlCmd(k.t.Context(), "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(string(b))
	if out, err := cmd.CombinedOutput(); err != nil {
		k.t.Fatalf("kubectl apply: %v: %s", err, out)
	}
}

// Pod is a pod on the node with runtimeClassName cryo, the test image
// (never pulled) and a short grace period (a shell loop as PID 1 ignores
// SIGTERM). containers are the pod's containers; set more fields on
// the returned spec.
func Pod(name string, annotations map[string]string, containers ...map[string]any) map[string]any {
	for _, c := range containers {
		if c["image"] == nil {
			c["image"] = Image
		}
		c["imagePullPolicy"] = "Never"
	}
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "annotations": annotations},
		"spec": map[string]any{
			"nodeName": NodeName, "runtimeClassName": RuntimeHandler, "restartPolicy": "Never",
			"terminationGracePeriodSeconds": 3, "containers": containers,
		},
	}
}

// Container is a container of Pod running a shell command.
func Container(name, script string) map[string]any {
	return map[string]any{"name": name, "command": []string{"sh", "-c", script}}
}

// WaitReady waits until pod is Ready and returns how long that took from
// since; it fails the test with the pod's description otherwise.
func (k *K8s) WaitReady(pod string, since time.Time, timeout time.Duration) time.Duration {
	k.t.Helper()
	if !WaitFor(timeout, func() bool {
		out, _, err := k.Kubectl("get", "pod", pod, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && strings.TrimSpace(out) == "True"
	}) {
		d, _, _ := k.Kubectl("describe", "pod", pod)
		k.t.Fatalf("pod %s not Ready within %s:\n%s", pod, timeout, d)
	}
	return time.Since(since)
}

// Exec runs a command in a pod's container through kubectl exec (API
// server, kubelet, containerd's streaming server).
func (k *K8s) Exec(pod, ctr string, cmd ...string) string {
	k.t.Helper()
	return k.MustKubectl(append([]string{"exec", pod, "-c", ctr, "--"}, cmd...)...)
}

// KubeletCheckpoint asks the kubelet's API to checkpoint a container
// (POST /checkpoint/{namespace}/{pod}/{container}) and returns the
// archive paths it reports.
func (k *K8s) KubeletCheckpoint(ns, pod, ctr string) ([]string, error) {
	url := fmt.Sprintf("https://%s:10250/checkpoint/%s/%s/%s?timeout=300", NodeIP, ns, pod, ctr)
	resp, err := k.Cluster.HTTPClient().Post(url, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kubelet checkpoint: %s: %s", resp.Status, b)
	}
	var r struct {
		Items []string `json:"items"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("kubelet checkpoint answer %q: %w", b, err)
	}
	return r.Items, nil
}
