package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/stack"
)

// The controller's deployment, as packaging/kubernetes/controller names it.
const (
	ControllerNamespace  = stack.ControllerNamespace
	ControllerDeployment = stack.ControllerDeployment
	ControllerImage      = stack.ControllerImage
	// ControllerImageFile is the OCI archive `make controller-image`
	// writes, under _output/images (or $CRYO_BIN/../images).
	ControllerImageFile = stack.ControllerImageFile
	// StoreCredentials is the Secret the Deployment takes its
	// STORAGE_S3_* environment from.
	StoreCredentials = stack.StoreCredentials
	// DefaultStore is the controller's --default-store in the K8s Env: a
	// namespace's repository is DefaultStore/<namespace> on the Env's S3.
	DefaultStore = "s3://" + S3Bucket + "/cryo"
	// RestoreCheckpointAnnotation names a Checkpoint to restore a pod from.
	RestoreCheckpointAnnotation = "cryo.dev/restore-checkpoint"
)

// Controller is the cryo controller running as a Deployment in a K8s Env
// (under runc), with its webhook answering.
type Controller struct {
	k       *K8s
	overlay string // the kustomization applied
}

// ControllerOption changes the controller's deployment.
type ControllerOption func(*controllerConfig)

type controllerConfig struct {
	env  map[string]string
	args []string
}

// ControllerEnv sets an environment variable of the controller's
// container (CRYO_DEFAULT_STORE, for example, or STORAGE_S3_* ones that
// override the Secret's).
func ControllerEnv(name, value string) ControllerOption {
	return func(c *controllerConfig) { c.env[name] = value }
}

// ControllerArgs appends arguments to the controller's command line
// (--checkpoint-deadline=30s, for example).
func ControllerArgs(args ...string) ControllerOption {
	return func(c *controllerConfig) { c.args = append(c.args, args...) }
}

// StartController deploys the controller from packaging/kubernetes/controller
// with an overlay for this cluster: runtimeClassName runc, the image
// `make controller-image` built (imported, never pulled), the API server
// at NodeIP:6443 (no kube-proxy serves the kubernetes Service), the
// Secret with the Env's S3 credentials and DefaultStore. It waits until
// the Deployment is Available and the webhook denies a restore from a
// missing Checkpoint. Cleanup deletes everything it created.
func (k *K8s) StartController(t testing.TB, opts ...ControllerOption) *Controller {
	t.Helper()
	k = k.T(t)
	cfg := &controllerConfig{env: map[string]string{
		"KUBERNETES_SERVICE_HOST": NodeIP,
		"KUBERNETES_SERVICE_PORT": "6443",
		"CRYO_DEFAULT_STORE":      DefaultStore,
	}}
	for _, o := range opts {
		o(cfg)
	}
	c := &Controller{k: k}
	k.importControllerImage(t)
	t.Cleanup(c.remove)
	k.MustKubectl("create", "namespace", ControllerNamespace)
	k.MustKubectl("-n", ControllerNamespace, "create", "secret", "generic", StoreCredentials,
		"--from-literal=STORAGE_S3_ENDPOINT=http://"+S3Addr,
		"--from-literal=STORAGE_S3_ACCESS_KEY_ID="+s3AccessKey,
		"--from-literal=STORAGE_S3_SECRET_ACCESS_KEY="+s3SecretKey,
		"--from-literal=STORAGE_S3_REGION="+s3Region)
	c.overlay = k.writeControllerOverlay(t, cfg)
	k.MustKubectl("apply", "-k", c.overlay)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dump of the controller log:\n%s", c.Logs())
		}
	})
	c.waitAvailable(t, 3*time.Minute)
	c.waitWebhook(t, 2*time.Minute)
	return c
}

// controllerImagePath finds the archive `make controller-image` writes.
func controllerImagePath(t testing.TB) string {
	t.Helper()
	var dirs []string
	if b := os.Getenv("CRYO_BIN"); b != "" {
		dirs = append(dirs, filepath.Join(b, "..", "images"))
	}
	dirs = append(dirs, filepath.Join(RepoRoot(t), "_output", "images"))
	for _, d := range dirs {
		p := filepath.Join(d, ControllerImageFile)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("%s not found in %s: run `make controller-image`", ControllerImageFile, strings.Join(dirs, " or "))
	return ""
}

// importControllerImage imports the controller's image into CRI's
// namespace and waits until CRI lists it.
func (k *K8s) importControllerImage(t testing.TB) {
	t.Helper()
	k.MustCtr("image", "import", "--snapshotter", "overlayfs", controllerImagePath(t))
	if !WaitFor(30*time.Second, func() bool {
		out, _, err := k.Crictl("images", "-q", ControllerImage)
		return err == nil && strings.TrimSpace(out) != ""
	}) {
		out, _, _ := k.Crictl("images")
		t.Fatalf("CRI does not list %s after the import:\n%s", ControllerImage, out)
	}
}

// writeControllerOverlay writes the kustomization over the packaged one
// that fits the Deployment to this cluster (stack.WriteControllerOverlay),
// and returns its directory.
func (k *K8s) writeControllerOverlay(t testing.TB, cfg *controllerConfig) string {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(RepoRoot(t), "packaging", "kubernetes", "controller")
	if err := k.Cluster.WriteControllerOverlay(t.Context(), dir, base, stack.ControllerOverlay{Env: cfg.env, Args: cfg.args}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitAvailable waits until the Deployment is Available with no pod of an
// older ReplicaSet or a terminating one left.
func (c *Controller) waitAvailable(t testing.TB, timeout time.Duration) {
	t.Helper()
	if _, _, err := c.k.Kubectl("-n", ControllerNamespace, "rollout", "status", "deployment/"+ControllerDeployment,
		"--timeout="+timeout.String()); err != nil {
		d, _, _ := c.k.Kubectl("-n", ControllerNamespace, "describe", "pods")
		t.Fatalf("deployment %s not Available within %s: %v\n%s\ncontroller log:\n%s", ControllerDeployment, timeout, err, d, c.Logs())
	}
	c.k.MustKubectl("-n", ControllerNamespace, "wait", "--for=condition=Available", "deployment/"+ControllerDeployment, "--timeout="+timeout.String())
}

// waitWebhook waits until the API server calls the webhook: a dry-run
// create of a pod naming a Checkpoint that does not exist is denied with
// the name in the message (until the webhook's certificate is in place
// the call fails, and the pod is refused for that reason instead).
func (c *Controller) waitWebhook(t testing.TB, timeout time.Duration) {
	t.Helper()
	var last string
	if !WaitFor(timeout, func() bool {
		last = c.TryRestorePod("default", "harness-webhook-probe", "harness-probe-missing")
		return strings.Contains(last, "denied") && strings.Contains(last, "harness-probe-missing")
	}) {
		t.Fatalf("the webhook does not deny a restore from a missing Checkpoint within %s; last answer: %s\ncontroller log:\n%s", timeout, last, c.Logs())
	}
}

// TryRestorePod creates (dry run, through admission) a cryo pod in ns
// annotated to restore from Checkpoint checkpoint and returns kubectl's
// output and error text: what the webhook made of it.
func (c *Controller) TryRestorePod(ns, name, checkpoint string) string {
	pod := Pod(name, map[string]string{RestoreCheckpointAnnotation: checkpoint}, Container("c", "sleep inf"))
	return c.DryRun(ns, pod)
}

// DryRun creates pod in ns as a dry run, through admission, and returns
// kubectl's output (the pod as admitted, JSON) or its error text.
func (c *Controller) DryRun(ns string, pod map[string]any) string {
	pod["metadata"].(map[string]any)["namespace"] = ns
	b, _ := json.Marshal(pod)
	cmd := c.k.Cluster.KubectlCmd(context.WithoutCancel(c.k.t.Context()), "create", "--dry-run=server", "-o", "json", "-f", "-")
	cmd.Stdin = strings.NewReader(string(b))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%v: %s", err, out)
	}
	return string(out)
}

// Pods are the controller's pods that are not being deleted.
func (c *Controller) Pods() []string {
	out, _, err := c.kubectl("-n", ControllerNamespace, "get", "pods", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil
	}
	var pods []string
	for _, l := range strings.Fields(out) {
		if name, deleted, _ := strings.Cut(l, "="); deleted == "" {
			pods = append(pods, name)
		}
	}
	return pods
}

// Restart deletes the controller's pod (SIGTERM, its grace period) and
// waits until the Deployment's new pod is Available and the webhook
// answers again.
func (c *Controller) Restart() { c.replace(false) }

// Kill deletes the controller's pod at once (SIGKILL, no grace period), as
// a crash or a lost node would, and waits for the new one like Restart.
func (c *Controller) Kill() { c.replace(true) }

func (c *Controller) replace(force bool) {
	t := c.k.t
	t.Helper()
	old := c.Pods()
	if len(old) == 0 {
		t.Fatal("no controller pod to restart")
	}
	args := append([]string{"-n", ControllerNamespace, "delete", "pod", "--wait=false"}, old...)
	if force {
		args = append(args, "--grace-period=0", "--force")
	}
	c.k.MustKubectl(args...)
	if !WaitFor(3*time.Minute, func() bool {
		out, _, err := c.k.Kubectl("-n", ControllerNamespace, "get", "pods", "-o",
			`jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		if err != nil {
			return false
		}
		ready := false
		for _, l := range strings.Fields(out) {
			name, status, _ := strings.Cut(l, "=")
			if slices.Contains(old, name) {
				return false // the old pod is still there
			}
			ready = ready || status == "True"
		}
		return ready
	}) {
		d, _, _ := c.k.Kubectl("-n", ControllerNamespace, "describe", "pods")
		t.Fatalf("no new controller pod Ready after deleting %v:\n%s", old, d)
	}
	c.waitAvailable(t, 3*time.Minute)
	c.waitWebhook(t, 2*time.Minute)
}

// Logs is the log of the controller's current pod (and of its previous
// container, if it restarted).
func (c *Controller) Logs() string {
	var b strings.Builder
	for _, p := range c.Pods() {
		if prev, _, err := c.kubectl("-n", ControllerNamespace, "logs", p, "--previous"); err == nil && prev != "" {
			fmt.Fprintf(&b, "--- %s (previous) ---\n%s", p, prev)
		}
		out, errs, _ := c.kubectl("-n", ControllerNamespace, "logs", p)
		fmt.Fprintf(&b, "--- %s ---\n%s%s", p, out, errs)
	}
	return b.String()
}

// remove deletes what StartController created: the webhook first (so that
// no pod creation waits for a controller that is going away), then the
// overlay's objects and the namespace with the Secret; it waits until the
// pods are gone, so that the Env's cleanup finds no container of them.
func (c *Controller) remove() {
	if c.overlay != "" {
		_, _, _ = c.kubectl("delete", "mutatingwebhookconfiguration", ControllerDeployment, "--ignore-not-found")
		_, _, _ = c.kubectl("delete", "-k", c.overlay, "--ignore-not-found", "--wait=true", "--timeout=90s")
	}
	_, _, _ = c.kubectl("delete", "namespace", ControllerNamespace, "--ignore-not-found", "--wait=true", "--timeout=90s")
}

// kubectl runs kubectl with a context that outlives the test's, for
// cleanup (t.Context is cancelled before the Cleanup functions run).
func (c *Controller) kubectl(args ...string) (string, string, error) {
	return c.k.Cluster.Kubectl(context.WithoutCancel(c.k.t.Context()), args...)
}

// T is c bound to a subtest: its failures end t.
func (c *Controller) T(t testing.TB) *Controller {
	return &Controller{k: c.k.T(t), overlay: c.overlay}
}
