package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
	"github.com/cryo-runtime/cryo/controller/apitest"
	"github.com/cryo-runtime/cryo/e2bapi"
)

// TestControllerWiring runs the controller as main does (with the E2B API
// and gateway) against a real kube-apiserver and etcd (envtest;
// KUBEBUILDER_ASSETS, default /var/cache/cryo/tools/bin from make deps)
// with the packaged CRD and webhook configuration, before the E2B label
// guard is applied: it becomes ready (certificate made and served, CA
// injected), its webhook answers and its reconciler refuses a Checkpoint
// of a missing pod all the same, while its E2B API and gateway answer 503
// naming what is wrong with the guard until it is in force (labelGuard);
// then its caches hold what they should (testCaches), and its E2B API and
// gateway answer 503 again while the guard's binding is deleted
// (guardRechecked). One manager per process: controller names are global
// to it.
func TestControllerWiring(t *testing.T) {
	cfg, c := startAPIServer(t)
	ctx := context.Background()
	log := &requestLog{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(log.wrap)

	probes, hook, gw := freePort(t), freePort(t), freePort(t)
	f := flags{defaultStore: "s3://snapshots/cryo", runtimeClasses: "cryo", namespace: "cryo-system", webhookPort: hook,
		probeAddr: fmt.Sprintf("127.0.0.1:%d", probes), metricsAddr: "0", leaderElect: true, deadline: time.Minute, certDir: t.TempDir(),
		e2bTemplates: "base=busybox:1", e2bAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), e2bSandboxAddr: fmt.Sprintf("127.0.0.1:%d", gw),
		e2bReapInterval: 50 * time.Millisecond, e2bGuardEvery: 300 * time.Millisecond}
	rctx, stop := context.WithCancel(ctx)
	mgr, err := setup(rctx, cfg, f)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	waitReady(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", probes), done)
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, types.NamespacedName{Name: controller.WebhookConfigName}, &mwc); err != nil {
		t.Fatal(err)
	}
	for _, w := range mwc.Webhooks {
		if len(w.ClientConfig.CABundle) == 0 {
			t.Errorf("webhook %s: no caBundle once ready", w.Name)
		}
	}
	if patch := admit(t, hook); !strings.Contains(patch, `"cryo.dev/checkpoint-to":"s3://snapshots/cryo/team-a/pods:pod-web"`) ||
		!strings.Contains(patch, `"`+controller.LabelRuntimeClass+`":"cryo"`) {
		t.Errorf("webhook patch %s", patch)
	}

	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "c1"}, Spec: cryov1.CheckpointSpec{PodName: "ghost"}}
	if err := c.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); cp.Status.Phase != cryov1.PhaseFailed; time.Sleep(100 * time.Millisecond) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(end) {
			t.Fatalf("Checkpoint of a missing pod: %+v", cp.Status)
		}
	}
	if cp.Status.Reason != cryov1.ReasonPodNotFound {
		t.Errorf("reason %s: %s", cp.Status.Reason, cp.Status.Message)
	}

	labelGuard(t, c, f)
	t.Run("caches", func(t *testing.T) { testCaches(t, mgr, c, log, gw) })
	t.Run("costs", func(t *testing.T) { testCosts(t, mgr, c, log, gw, f.e2bAddr, f.e2bReapInterval) })
	t.Run("label guard re-checked", func(t *testing.T) { guardRechecked(t, c, f) })
}

// guardRechecked: once the label guard's binding is deleted, the E2B API
// and the gateway answer every request 503 naming it within the poll
// interval (and a check's time), and serve again once it is back.
func guardRechecked(t *testing.T, c client.Client, f flags) {
	ctx := context.Background()
	e2bAnswers(t, f, "with the guard", http.StatusUnauthorized, http.StatusBadGateway, "")
	var bind admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := c.Get(ctx, types.NamespacedName{Name: e2bapi.LabelGuard}, &bind); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &bind); err != nil {
		t.Fatal(err)
	}
	e2bAnswers(t, f, "binding deleted", http.StatusServiceUnavailable, http.StatusServiceUnavailable, "ValidatingAdmissionPolicyBinding "+e2bapi.LabelGuard+" not found")
	bind.ResourceVersion, bind.UID = "", ""
	if err := c.Create(ctx, &bind); err != nil {
		t.Fatal(err)
	}
	e2bAnswers(t, f, "binding restored", http.StatusUnauthorized, http.StatusBadGateway, "")
}

// e2bAnswers waits, up to the guard's poll interval and a second, until
// the E2B API answers a sandbox list apiCode and the gateway a request for
// an unknown sandbox gwCode, both with body in what they say. Served, the
// API refuses the missing key (401), the gateway the unknown id (502).
func e2bAnswers(t *testing.T, f flags, what string, apiCode, gwCode int, body string) {
	t.Helper()
	get := func(u string) (int, string) { return sandboxGet(t, u, "nosuch1") }
	start := time.Now()
	for end := start.Add(f.e2bGuardEvery + time.Second); ; time.Sleep(20 * time.Millisecond) {
		c1, b1 := get("http://" + f.e2bAddr + "/v2/sandboxes")
		c2, b2 := get("http://" + f.e2bSandboxAddr + "/health")
		if c1 == apiCode && c2 == gwCode && strings.Contains(b1, body) && strings.Contains(b2, body) {
			t.Logf("%s: after %s (poll interval %s)", what, time.Since(start).Round(time.Millisecond), f.e2bGuardEvery)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the API answers %d %s, the gateway %d %s; want %d and %d with %q", what, c1, b1, c2, b2, apiCode, gwCode, body)
		}
	}
}

// startAPIServer starts a kube-apiserver and etcd (envtest) with the
// packaged CRD, and creates the RuntimeClasses cryo and runc, the
// namespaces cryo-system (with the webhook's empty Secret) and team-a, and
// the packaged webhook configuration.
func startAPIServer(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	pkg := filepath.Join("..", "..", "packaging", "kubernetes", "controller")
	env, cfg, err := apitest.Start(filepath.Join(pkg, "crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = cryov1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "cryo"}, Handler: "cryo"},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cryo-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: controller.CertSecretName}},
		packagedWebhook(t, filepath.Join(pkg, "webhook.yaml")),
	} {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	return cfg, c
}

// labelGuard: a controller started before the packaged label guard was
// applied answers every E2B request 503 naming what is wrong with the
// guard, step by step as an admin applies it for the identity the
// controller runs as (here the test's admin, which the policy is then
// changed to name, its one change), and serves once it is in force.
func labelGuard(t *testing.T, c client.Client, f flags) {
	t.Helper()
	ctx := context.Background()
	refused := func(what, want string) {
		t.Helper()
		e2bAnswers(t, f, what, http.StatusServiceUnavailable, http.StatusServiceUnavailable, want)
	}
	refused("no policy", "ValidatingAdmissionPolicy "+e2bapi.LabelGuard+" not found")
	pol, bind, err := apitest.Policy(filepath.Join("..", "..", "packaging", "kubernetes", "controller", "e2b-labels.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &pol); err != nil {
		t.Fatal(err)
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		t.Fatal(err)
	}
	me := review.Status.UserInfo.Username
	// JSON-escaped, as both answer it.
	refused("policy naming another controller", `the controller runs as \"`+me+`\"`)
	for i, v := range pol.Spec.Variables {
		if v.Name == "controller" {
			pol.Spec.Variables[i].Expression = "'" + me + "'"
		}
	}
	if err := c.Update(ctx, &pol); err != nil {
		t.Fatal(err)
	}
	refused("no binding", "ValidatingAdmissionPolicyBinding "+e2bapi.LabelGuard+" not found")
	if err := c.Create(ctx, &bind); err != nil {
		t.Fatal(err)
	}
	e2bAnswers(t, f, "guard in force", http.StatusUnauthorized, http.StatusBadGateway, "")
}

func packagedWebhook(t *testing.T, path string) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(b, &mwc); err != nil {
		t.Fatal(err)
	}
	return &mwc
}

// admit sends the webhook an admission review of a new cryo pod web in
// team-a and returns the JSON patch it answers.
func admit(t *testing.T, port int) string {
	t.Helper()
	cryo := "cryo"
	raw, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{RuntimeClassName: &cryo}})
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "1", Namespace: "team-a", Operation: admissionv1.Create,
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Object: runtime.RawExtension{Raw: raw}},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	// The API server checks the certificate against the caBundle; this
	// test checks what the webhook says.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Post(fmt.Sprintf("https://127.0.0.1:%d%s", port, controller.WebhookPath), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&review); err != nil || review.Response == nil || !review.Response.Allowed {
		t.Fatalf("webhook answer %d: %v %+v", resp.StatusCode, err, review.Response)
	}
	return string(review.Response.Patch)
}

func waitReady(t *testing.T, url string, done chan error) {
	t.Helper()
	var last string
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err // for the cleanup that waits for it
			t.Fatalf("controller stopped: %v", err)
		default:
		}
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = string(b)
		}
		if time.Now().After(end) {
			t.Fatalf("not ready after 60s: %s", last)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
