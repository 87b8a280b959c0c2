package controller

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// TestWebhookThroughTheAPIServer installs the packaged
// MutatingWebhookConfiguration (its CEL matchConditions and failure
// policies as shipped; only the address, CA and a namespace selector
// changed) in a real API server and creates pods through it, with the
// webhook up and then down: down, only restores by name are refused. Up,
// a restore into a pod of another RuntimeClass is refused, one without a
// RuntimeClass admitted with a warning.
func TestWebhookThroughTheAPIServer(t *testing.T) {
	c := apiServer(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "turn-3"}, Spec: cryov1.CheckpointSpec{PodName: "agent"}}
	if err := c.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	cp.Status = cryov1.CheckpointStatus{Phase: cryov1.PhaseSucceeded, Snapshot: "s3://snapshots/cryo/" + ns.Name + "@" + testDigest}
	if err := c.Status().Update(ctx, cp); err != nil {
		t.Fatal(err)
	}

	stopServer := startWebhook(t, c, ns.Name, &PodMutator{Reader: c, DefaultStore: "s3://snapshots/cryo", RuntimeClasses: []string{"cryo"}})

	cryo, runc := "cryo", "runc"
	newPod := func(name string, class *string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Annotations: ann},
			Spec: corev1.PodSpec{RuntimeClassName: class, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}

	restored := newPod("agent", &cryo, map[string]string{AnnotationRestoreCheckpoint: "turn-3"})
	if err := c.Create(ctx, restored); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		AnnotationRestoreFrom:   "s3://snapshots/cryo/" + ns.Name + ":cp-" + string(cp.UID),
		AnnotationRestoreDigest: testDigest,
		AnnotationCheckpointTo:  "s3://snapshots/cryo/" + ns.Name + "/pods:pod-agent",
	}
	for k, v := range want {
		if restored.Annotations[k] != v {
			t.Errorf("restored pod: %s = %q, want %q", k, restored.Annotations[k], v)
		}
	}
	err := c.Create(ctx, newPod("ghost", &cryo, map[string]string{AnnotationKruiseRestoreFrom: "nope"}))
	if err == nil || !strings.Contains(err.Error(), `Checkpoint "nope" not found in namespace "`+ns.Name+`"`) {
		t.Errorf("restore from a missing Checkpoint: %v", err)
	}
	// Restores only under a cryo RuntimeClass: another one is refused,
	// none is admitted with a warning (the node's default runtime decides).
	err = c.Create(ctx, newPod("restore-runc", &runc, map[string]string{AnnotationRestoreCheckpoint: "turn-3"}))
	if err == nil || !strings.Contains(err.Error(), `admission webhook "restore.cryo.dev" denied the request: restore from Checkpoint "turn-3": spec.runtimeClassName "runc" is not a cryo RuntimeClass (cryo)`) {
		t.Errorf("restore into a runc pod: %v, want a denial naming spec.runtimeClassName", err)
	}
	warned := &warnings{}
	cfg := rest.CopyConfig(envCfg)
	cfg.WarningHandler = warned
	wc, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	noClass := newPod("restore-no-class", nil, map[string]string{AnnotationRestoreCheckpoint: "turn-3"})
	if err := wc.Create(ctx, noClass); err != nil || noClass.Annotations[AnnotationRestoreFrom] != want[AnnotationRestoreFrom] {
		t.Errorf("restore without a RuntimeClass: %v, annotations %v", err, noClass.Annotations)
	}
	if got := warned.get(); len(got) != 1 || !strings.Contains(got[0], "spec.runtimeClassName is not set: the pod is restored from the Checkpoint only if its node's default runtime is cryo's") {
		t.Errorf("restore without a RuntimeClass: warnings %q", got)
	}
	fresh := newPod("fresh", &cryo, nil)
	if err := c.Create(ctx, fresh); err != nil || fresh.Annotations[AnnotationCheckpointTo] != "s3://snapshots/cryo/"+ns.Name+"/pods:pod-fresh" {
		t.Errorf("cryo pod: %v, annotations %v", err, fresh.Annotations)
	}
	other := newPod("other", &runc, nil)
	if err := c.Create(ctx, other); err != nil || len(other.Annotations) != 0 {
		t.Errorf("runc pod: %v, annotations %v", err, other.Annotations)
	}
	own := newPod("own-target", &cryo, map[string]string{AnnotationCheckpointTo: "s3://snapshots/cryo/" + ns.Name + "/mine:x"})
	if err := c.Create(ctx, own); err != nil || own.Annotations[AnnotationCheckpointTo] != "s3://snapshots/cryo/"+ns.Name+"/mine:x" {
		t.Errorf("cryo pod with its own target: %v, annotations %v", err, own.Annotations)
	}
	// The label that puts a pod in the controller's cache: on every cryo
	// pod, whichever entry admitted it, and on no other.
	for _, p := range []*corev1.Pod{restored, fresh, own} {
		if p.Labels[LabelRuntimeClass] != "cryo" {
			t.Errorf("cryo pod %s: labels %v, want %s=cryo", p.Name, p.Labels, LabelRuntimeClass)
		}
	}
	if _, ok := other.Labels[LabelRuntimeClass]; ok {
		t.Errorf("runc pod labelled %v", other.Labels)
	}

	stopServer()
	down := newPod("cryo-while-down", &cryo, nil)
	for _, p := range []*corev1.Pod{newPod("plain", nil, nil), down} {
		if err := c.Create(ctx, p); err != nil {
			t.Errorf("pod %s with the webhook down: %v (only restores by name may be refused)", p.Name, err)
		}
	}
	// Admitted unlabelled: the reconciler reads such a pod from the API
	// server (TestCheckpointOfUnlabelledPod).
	if _, ok := down.Labels[LabelRuntimeClass]; ok {
		t.Errorf("pod admitted with the webhook down is labelled %v", down.Labels)
	}
	if err := c.Create(ctx, newPod("restore-while-down", &cryo, map[string]string{AnnotationRestoreCheckpoint: "turn-3"})); err == nil {
		t.Error("a restore by name was admitted with the webhook down (failurePolicy Fail)")
	}
}

// warnings records the API server's warnings to a client.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// startWebhook serves m as the packaged webhook configuration does, for
// the pods of namespace ns, until the returned function (or the test's
// cleanup) stops it.
func startWebhook(t *testing.T, c client.Client, ns string, m *PodMutator) (stop func()) {
	t.Helper()
	dir := t.TempDir()
	ca := serveCerts(t, dir)
	port := freePort(t)
	installWebhook(t, c, ns, ca, port)
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir})
	srv.Register(WebhookPath, &webhook.Admission{Handler: m})
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(sctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("webhook server: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	waitListening(t, port)
	return stop
}

// serveCerts writes a serving certificate for localhost into dir and
// returns its CA.
func serveCerts(t *testing.T, dir string) []byte {
	t.Helper()
	cr := &rotator.CertRotator{CAName: "test-ca", CAOrganization: "cryo", DNSName: "localhost",
		ExtKeyUsages: &[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	begin, end := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	ca, err := cr.CreateCACert(begin, end)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := cr.CreateCertPEM(ca, begin, end)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFiles(dir, map[string][]byte{"tls.crt": crt, "tls.key": key}); err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM
}

// installWebhook creates the packaged webhook configuration, pointed at
// https://localhost:port and limited to namespace ns.
func installWebhook(t *testing.T, c client.Client, ns string, ca []byte, port int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "packaging", "kubernetes", "controller", "webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(b, &mwc); err != nil {
		t.Fatal(err)
	}
	mwc.Name = "cryo-controller-" + ns
	url := "https://localhost:" + strconv.Itoa(port) + *mwc.Webhooks[0].ClientConfig.Service.Path
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca}
		w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
	}
	if len(mwc.Webhooks) != 2 || len(mwc.Webhooks[0].MatchConditions) == 0 {
		t.Fatalf("webhook.yaml: %d webhooks", len(mwc.Webhooks))
	}
	if err := c.Create(context.Background(), &mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), &mwc) })
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

func waitListening(t *testing.T, port int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(end) {
			t.Fatalf("webhook server not listening on %d: %v", port, err)
		}
	}
}
