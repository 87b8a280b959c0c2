package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// TestCertificatesMadeAndInjected: against a real API server, the rotator
// fills the webhook Secret, CertSync serves its certificate (valid for the
// webhook Service's name, signed by the CA) and the CA lands in the
// MutatingWebhookConfiguration's caBundle.
func TestCertificatesMadeAndInjected(t *testing.T) {
	c := apiServer(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cryo-system-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: CertSecretName}}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	none, fail := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail
	path := WebhookPath
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: WebhookConfigName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "restore.cryo.dev", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none, FailurePolicy: &fail,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: ns.Name, Name: WebhookService, Path: &path}},
			// Matches nothing: the API server never calls it here.
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"cryo.dev/never": "x"}},
		}},
	}
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), mwc) })

	mgr, err := ctrl.NewManager(envCfg, ctrl.Options{Scheme: testScheme(t), Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Logger: log.Log})
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	certs := &CertSync{Reader: mgr.GetAPIReader(), Secret: types.NamespacedName{Namespace: ns.Name, Name: CertSecretName},
		CertDir: certDir, Every: 200 * time.Millisecond}
	if err := mgr.Add(certs); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	if err := addCertRotator(mgr, ns.Name, certDir, ready, "cert-rotator-"+ns.Name); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("CA not injected after 60s")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: WebhookConfigName}, mwc); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if len(mwc.Webhooks[0].ClientConfig.CABundle) == 0 || !pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle) {
		t.Fatalf("caBundle %q", mwc.Webhooks[0].ClientConfig.CABundle)
	}
	var cert *tls.Certificate
	for end := time.Now().Add(30 * time.Second); cert == nil; time.Sleep(100 * time.Millisecond) {
		cert, _ = certs.GetCertificate(nil)
		if time.Now().After(end) {
			t.Fatal("CertSync loaded no certificate after 30s")
		}
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	dns := WebhookService + "." + ns.Name + ".svc"
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: dns, Roots: pool}); err != nil {
		t.Fatalf("served certificate for %v does not verify as %s against the injected CA: %v", leaf.DNSNames, dns, err)
	}
	if certs.Ready() != nil {
		t.Fatal("CertSync not ready with a certificate loaded")
	}
}
