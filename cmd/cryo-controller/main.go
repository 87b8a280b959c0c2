// Command cryo-controller runs the cluster side of cryo as a Deployment:
// the Checkpoint reconciler, which checkpoints pods through the API
// server's node proxy and records the snapshots it finds in the store, and
// the pod mutating webhook (restore by Checkpoint name, default checkpoint
// target). See docs/controller.md.
//
// It logs through controller-runtime's zap logger (logr), the convention of
// Kubernetes controllers, not through containerd's log package that the
// node's binaries use: this binary never runs inside containerd.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
	"github.com/cryo-runtime/cryo/e2bapi"
	"github.com/cryo-runtime/cryo/stores"
)

type flags struct {
	defaultStore   string
	runtimeClasses string
	namespace      string
	webhookPort    int
	probeAddr      string
	metricsAddr    string
	leaderElect    bool
	deadline       time.Duration
	certDir        string
	e2bAddr        string
	e2bTemplates   string
	e2bSandboxAddr string
	// e2bReapInterval is how often the E2B reaper looks for expired
	// sandboxes; 0 means its default. Tests shorten it; it has no
	// command-line flag.
	e2bReapInterval time.Duration
	e2bGuardEvery   time.Duration
	nodeCheckpoints int
}

// nodeCalls is the Reconciler's NodeCalls for --node-checkpoints, whose 0
// is no bound (the field's 0 is its default).
func nodeCalls(flag int) int {
	if flag <= 0 {
		return -1
	}
	return flag
}

func main() {
	var f flags
	flag.StringVar(&f.defaultStore, "default-store", os.Getenv("CRYO_DEFAULT_STORE"), "store base URL of the namespaces' checkpoint repositories, <base>/<namespace> (env CRYO_DEFAULT_STORE); empty: pods get no default cryo.dev/checkpoint-to")
	flag.StringVar(&f.runtimeClasses, "runtime-classes", "cryo", "comma-separated RuntimeClass names that run pods on cryo")
	flag.StringVar(&f.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the controller's namespace, home of the webhook Secret and the leader lease (env POD_NAMESPACE)")
	flag.IntVar(&f.webhookPort, "webhook-port", 9443, "port of the mutating webhook (HTTPS)")
	flag.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.StringVar(&f.metricsAddr, "metrics-bind-address", "0", "address of the metrics endpoint, 0 to disable")
	flag.BoolVar(&f.leaderElect, "leader-elect", false, "elect a leader among replicas (a Lease in --namespace) before reconciling")
	flag.DurationVar(&f.deadline, "checkpoint-deadline", controller.DefaultDeadline, "a Checkpoint not done this long after it started fails with reason Timeout")
	flag.IntVar(&f.nodeCheckpoints, "node-checkpoints", controller.DefaultNodeCalls, "how many checkpoints may run on one node at once (the kubelet calls in flight); more wait in Pending, the node's namespaces taking turns; 0: no bound")
	flag.StringVar(&f.certDir, "cert-dir", filepath.Join(os.TempDir(), "cryo-controller-certs"), "where the webhook's certificate is written")
	flag.StringVar(&f.e2bAddr, "e2b-api-bind-address", "", "address of E2B's control-plane REST API (docs/e2b.md), e.g. :3000; empty: not served")
	flag.StringVar(&f.e2bSandboxAddr, "e2b-sandbox-bind-address", "", "address of the sandbox gateway that E2B_SANDBOX_URL points at (envd of each sandbox, docs/e2b.md), e.g. :3001; empty: not served; needs --e2b-api-bind-address")
	flag.DurationVar(&f.e2bGuardEvery, "e2b-label-guard-interval", e2bapi.DefaultGuardInterval, "how often the E2B API checks that its label guard is in force; it answers 503 while not")
	flag.StringVar(&f.e2bTemplates, "e2b-templates", "base=busybox:1", "E2B templates, comma-separated name=image; each runs `sleep inf` under --runtime-classes' first class")
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	if err := run(ctrl.SetupSignalHandler(), nil, f); err != nil {
		ctrl.Log.Error(err, "cryo-controller failed")
		os.Exit(1)
	}
}

// run runs the controller until ctx ends; cfg nil means the in-cluster
// config or --kubeconfig.
func run(ctx context.Context, cfg *rest.Config, f flags) error {
	mgr, err := setup(ctx, cfg, f)
	if err != nil {
		return err
	}
	ctrl.Log.Info("starting", "defaultStore", f.defaultStore, "runtimeClasses", f.runtimeClasses, "namespace", f.namespace, "deadline", f.deadline)
	return mgr.Start(ctx)
}

// setup checks the flags and builds the manager with everything added.
func setup(ctx context.Context, cfg *rest.Config, f flags) (ctrl.Manager, error) {
	if f.namespace == "" {
		return nil, errors.New("--namespace (or env POD_NAMESPACE) is required")
	}
	classes := splitList(f.runtimeClasses)
	if len(classes) == 0 {
		return nil, errors.New("--runtime-classes names no RuntimeClass")
	}
	podCache, err := controller.PodCache(classes)
	if err != nil {
		return nil, fmt.Errorf("--runtime-classes: %w", err)
	}
	if f.e2bSandboxAddr != "" && f.e2bAddr == "" {
		return nil, errors.New("--e2b-sandbox-bind-address needs --e2b-api-bind-address: the gateway reaches the sandboxes the API creates")
	}
	if f.e2bAddr != "" {
		if _, err := parseTemplates(f.e2bTemplates); err != nil {
			return nil, fmt.Errorf("--e2b-templates: %w", err)
		}
		if f.e2bGuardEvery <= 0 {
			return nil, errors.New("--e2b-label-guard-interval must be positive")
		}
	}
	if f.defaultStore != "" {
		if err := controller.CheckStoreBase(f.defaultStore); err != nil {
			return nil, fmt.Errorf("--default-store: %w", err)
		}
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := cryov1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if cfg == nil {
		var err error
		if cfg, err = ctrl.GetConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes client config: %w", err)
		}
	}
	var guard *e2bapi.GuardMonitor
	if f.e2bAddr != "" {
		if guard, err = labelGuardMonitor(ctx, cfg, scheme, f.e2bGuardEvery); err != nil {
			return nil, fmt.Errorf("e2b API: %w", err)
		}
	}
	certs := &controller.CertSync{
		Secret:  types.NamespacedName{Namespace: f.namespace, Name: controller.CertSecretName},
		CertDir: f.certDir,
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// The reconciler watches pods: without a selector every pod of
		// the cluster would be in memory, for the few of cryo's.
		Cache:                   cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: podCache}},
		Metrics:                 metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress:  f.probeAddr,
		LeaderElection:          f.leaderElect,
		LeaderElectionID:        "cryo-controller.cryo.dev",
		LeaderElectionNamespace: f.namespace,
		// A replaced pod hands over at once instead of after the lease's
		// 15 seconds (the process exits right after the manager stops).
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: webhook.NewServer(webhook.Options{
			Port:    f.webhookPort,
			CertDir: f.certDir,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.GetCertificate = certs.GetCertificate }},
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	certs.Reader = mgr.GetAPIReader()
	if err := mgr.Add(certs); err != nil {
		return nil, err
	}
	caInjected := make(chan struct{})
	if err := controller.AddCertRotator(mgr, f.namespace, f.certDir, caInjected); err != nil {
		return nil, fmt.Errorf("certificate rotator: %w", err)
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	r := &controller.Reconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Recorder:       mgr.GetEventRecorder("cryo-controller"),
		Kubelet:        controller.NodeProxyKubelet{REST: cs.CoreV1().RESTClient()},
		Open:           controller.StoreOpener(stores.Options{}),
		RuntimeClasses: classes,
		StoreBase:      f.defaultStore,
		Deadline:       f.deadline,
		NodeCalls:      nodeCalls(f.nodeCheckpoints),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("reconciler: %w", err)
	}
	if err := mgr.Add(&controller.LabelPolicyCheck{Reader: mgr.GetAPIReader(), Log: ctrl.Log.WithName("label-policy")}); err != nil {
		return nil, err
	}
	mgr.GetWebhookServer().Register(controller.WebhookPath, &webhook.Admission{Handler: &controller.PodMutator{
		Reader:         mgr.GetAPIReader(),
		DefaultStore:   f.defaultStore,
		RuntimeClasses: classes,
	}})
	if f.e2bAddr != "" {
		if err := addE2BAPI(ctx, mgr, f, classes[0], cs.CoreV1().RESTClient(), guard); err != nil {
			return nil, fmt.Errorf("e2b API: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	// Ready once the webhook serves its certificate and the API server
	// holds the CA that verifies it: from then on the webhook answers.
	if err := mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error { return certs.Ready() }); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("webhook-ca-injected", func(*http.Request) error {
		select {
		case <-caInjected:
			return nil
		default:
			return errors.New("CA not yet in the MutatingWebhookConfiguration " + controller.WebhookConfigName)
		}
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// addE2BAPI serves E2B's API from this binary: it is a thin layer over
// the Checkpoint resource that this binary reconciles, with the same
// RBAC, image and Deployment; a second binary would only add a rollout.
func addE2BAPI(ctx context.Context, mgr ctrl.Manager, f flags, runtimeClass string, core rest.Interface, guard *e2bapi.GuardMonitor) error {
	templates, err := parseTemplates(f.e2bTemplates)
	if err != nil {
		return fmt.Errorf("--e2b-templates: %w", err)
	}
	// Uncached: a cache would watch every Secret and pod of the cluster.
	// The gateway, the reaper and Sandbox.list read the manager's cache, which holds
	// cryo's pods (sandboxes among them) and the Checkpoints; the key
	// lookup a cache of the key Secrets alone.
	cl, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	opts := e2bapi.KeyCache(f.namespace)
	opts.Scheme, opts.Mapper = mgr.GetScheme(), mgr.GetRESTMapper()
	keys, err := cache.New(mgr.GetConfig(), opts)
	if err != nil {
		return fmt.Errorf("key Secrets' cache: %w", err)
	}
	if _, err := keys.GetInformer(ctx, &corev1.Secret{}); err != nil {
		return fmt.Errorf("key Secrets' informer: %w", err)
	}
	if err := mgr.Add(startedCache{keys}); err != nil {
		return err
	}
	// The informers start with the cache on every replica, not with the
	// leader's reconciler: the gateway serves on all of them, after the
	// caches synced.
	if err := e2bapi.IndexSandboxes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("index sandbox pods and Checkpoints: %w", err)
	}
	srv := &e2bapi.Server{
		Client:       cl,
		Cache:        mgr.GetCache(),
		Keys:         keys,
		Namespace:    f.namespace,
		RuntimeClass: runtimeClass,
		DefaultStore: f.defaultStore,
		Templates:    templates,
		ReapInterval: f.e2bReapInterval,
		Log:          ctrl.Log.WithName("e2b"),
		// envd's /init is a pod-network call: the Deployment's pod
		// reaches the sandboxes' addresses, as the gateway does.
		HTTPClient: &http.Client{Timeout: 10 * time.Second},
		NodeStats: func(ctx context.Context, node string) ([]byte, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return core.Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
		},
		Guard: guard,
	}
	if err := mgr.Add(guard); err != nil {
		return err
	}
	if err := mgr.Add(&e2bapi.Listener{Server: srv, Addr: f.e2bAddr}); err != nil {
		return err
	}
	if f.e2bSandboxAddr != "" {
		gw := &e2bapi.Gateway{Server: srv, Cache: mgr.GetCache()}
		if err := mgr.Add(&e2bapi.GatewayListener{Gateway: gw, Addr: f.e2bSandboxAddr}); err != nil {
			return err
		}
	}
	return mgr.Add(&e2bapi.Reaper{Server: srv, Cache: mgr.GetCache()})
}

// startedCache is a cache the manager starts with its own, on every
// replica (not only the leader), and waits for before the API serves.
type startedCache struct{ cache.Cache }

func (c startedCache) GetCache() cache.Cache { return c.Cache }

// labelGuardMonitor checks, through the API server, whether the E2B
// label guard is in force for the identity the controller runs as, before
// anything serves, and returns the monitor that keeps checking it every
// interval once the manager runs. A guard missing or wrong is logged and
// the E2B API and gateway answer 503 until it is in force; the controller
// starts anyway: its Checkpoint reconciler and webhook do not depend on
// the guard, and a controller that refused to start would take them down
// with the E2B API.
func labelGuardMonitor(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, every time.Duration) (*e2bapi.GuardMonitor, error) {
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	m := &e2bapi.GuardMonitor{Client: cl, Interval: every, Log: ctrl.Log.WithName("e2b")}
	_ = m.Check(ctx) // logs what is wrong; Err holds it for the API
	return m, nil
}

// parseTemplates reads name=image pairs.
func parseTemplates(s string) (map[string]e2bapi.Template, error) {
	out := map[string]e2bapi.Template{}
	for _, p := range splitList(s) {
		name, image, ok := strings.Cut(p, "=")
		if !ok || name == "" || image == "" {
			return nil, fmt.Errorf("%q is not name=image", p)
		}
		out[name] = e2bapi.Template{Image: image, Command: []string{"sleep", "inf"}}
	}
	if len(out) == 0 {
		return nil, errors.New("no template")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
