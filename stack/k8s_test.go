package stack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// removeLinksInto removes only the links that point into the control
// plane's own directory (the kubelet's /var/log/containers entries for its
// pods), never other files or links.
func TestRemoveLinksInto(t *testing.T) {
	dir, ours, other := t.TempDir(), t.TempDir(), t.TempDir()
	for name, target := range map[string]string{
		"ours.log":    filepath.Join(ours, "pod-logs", "a", "0.log"),
		"other.log":   filepath.Join(other, "b.log"),
		"prefix.log":  ours + "-not-ours/c.log",
		"regular.log": "",
	} {
		p := filepath.Join(dir, name)
		var err error
		if target == "" {
			err = os.WriteFile(p, nil, 0o600)
		} else {
			err = os.Symlink(target, p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	removeLinksInto(dir, ours)
	for name, want := range map[string]bool{"ours.log": false, "other.log": true, "prefix.log": true, "regular.log": true} {
		if _, err := os.Lstat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}

// The API server's certificate verifies, against the CA pods get as
// kube-root-ca.crt, for every address a client uses: the node's (pods),
// loopback (the node's parts) and the kubernetes Service's names.
func TestAPIServerCerts(t *testing.T) {
	caPEM, certPEM, keyPEM, err := apiServerCerts("10.250.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("serving key pair: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA does not parse")
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"10.250.0.1", "127.0.0.1", "10.96.0.1", "kubernetes.default.svc"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.250.0.2"}); err == nil {
		t.Error("the certificate verifies for another node's address")
	}
}

// TestHostLockOnePerMachine: a second control plane waits for the first
// one's Close, and gives up, naming the lock, when its context ends.
func TestHostLockOnePerMachine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k8s.lock")
	first, second := &K8s{}, &K8s{}
	if err := first.lockHost(t.Context(), path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	err := second.lockHost(ctx, path)
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while the first is held: %v, want a deadline error naming %s", err, path)
	}
	got := make(chan error, 1)
	go func() { got <- second.lockHost(t.Context(), path) }()
	time.Sleep(100 * time.Millisecond)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second lock after the first's Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second control plane still waits after the first's Close")
	}
	_ = second.Close()
}
