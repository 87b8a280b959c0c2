package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Names of the webhook's objects (packaging/kubernetes/controller).
const (
	WebhookConfigName = "cryo-controller"
	WebhookService    = "cryo-controller-webhook"
	CertSecretName    = "cryo-controller-webhook-cert"
)

// AddCertRotator makes the manager create and rotate the webhook's CA and
// serving certificate in the Secret CertSecretName of namespace
// (open-policy-agent/cert-controller, as Gatekeeper does) and inject the
// CA into the MutatingWebhookConfiguration WebhookConfigName. ready is
// closed once the CA is injected.
func AddCertRotator(mgr manager.Manager, namespace, certDir string, ready chan struct{}) error {
	return addCertRotator(mgr, namespace, certDir, ready, "cert-rotator")
}

// addCertRotator is AddCertRotator with the name of the rotator's
// controller, unique per process (tests start several).
func addCertRotator(mgr manager.Manager, namespace, certDir string, ready chan struct{}, name string) error {
	return rotator.AddRotator(mgr, &rotator.CertRotator{
		ControllerName: name,
		SecretKey:      types.NamespacedName{Namespace: namespace, Name: CertSecretName},
		CertDir:        certDir,
		CAName:         "cryo-controller-ca",
		CAOrganization: "cryo",
		DNSName:        WebhookService + "." + namespace + ".svc",
		ExtraDNSNames:  []string{WebhookService + "." + namespace + ".svc.cluster.local", WebhookService + "." + namespace},
		IsReady:        ready,
		Webhooks:       []rotator.WebhookInfo{{Name: WebhookConfigName, Type: rotator.Mutating}},
		// Every replica serves the webhook, so every one keeps the Secret
		// valid (the rotator's updates are conflict-checked).
		RequireLeaderElection: false,
	})
}

// CertSync serves the webhook's certificate straight from the Secret the
// rotator writes, polled through the API server, instead of a Secret
// volume that the kubelet refreshes only every minute or so: the webhook
// answers seconds after the controller starts. It also writes the pair
// into CertDir, where the rotator checks that it arrived.
type CertSync struct {
	Reader  client.Reader // uncached: the manager's API reader
	Secret  types.NamespacedName
	CertDir string
	Every   time.Duration

	cert atomic.Pointer[tls.Certificate]
	pem  []byte
}

// GetCertificate is the webhook server's tls.Config.GetCertificate.
func (c *CertSync) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cert := c.cert.Load(); cert != nil {
		return cert, nil
	}
	return nil, errors.New("webhook certificate not ready")
}

// Ready is a readiness check: the certificate is loaded.
func (c *CertSync) Ready() error {
	if c.cert.Load() == nil {
		return errors.New("webhook certificate not loaded yet")
	}
	return nil
}

// Start polls the Secret until ctx ends.
func (c *CertSync) Start(ctx context.Context) error {
	every := c.Every
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := c.sync(ctx); err != nil {
			log.FromContext(ctx).V(1).Info("webhook certificate not synced", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: every replica serves the webhook.
func (c *CertSync) NeedLeaderElection() bool { return false }

func (c *CertSync) sync(ctx context.Context) error {
	var s corev1.Secret
	if err := c.Reader.Get(ctx, c.Secret, &s); err != nil {
		return err
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return fmt.Errorf("secret %s has no %s/%s yet", c.Secret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	pem := append(append([]byte{}, crt...), key...)
	if bytes.Equal(pem, c.pem) {
		return nil
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return fmt.Errorf("secret %s: %w", c.Secret, err)
	}
	if err := writeFiles(c.CertDir, map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}); err != nil {
		return err
	}
	c.cert.Store(&pair)
	c.pem = pem
	log.FromContext(ctx).Info("webhook certificate loaded", "secret", c.Secret.String())
	return nil
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range files {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}
