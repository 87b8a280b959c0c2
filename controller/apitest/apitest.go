// Package apitest starts a real kube-apiserver and etcd for the cluster
// packages' tests (controller-runtime's envtest), from the binaries that
// `make deps` installs. Only tests import it.
package apitest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// DefaultAssets is where `make deps` installs kube-apiserver and etcd.
const DefaultAssets = "/var/cache/cryo/tools/bin"

// Start starts kube-apiserver and etcd from KUBEBUILDER_ASSETS (default
// DefaultAssets) with the CRDs at crdPaths installed, and returns the
// admin's config. The caller stops env. A missing binary is an error that
// says what to install.
func Start(crdPaths ...string) (*envtest.Environment, *rest.Config, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = DefaultAssets
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, nil, fmt.Errorf("%s not found in %s (KUBEBUILDER_ASSETS): run make deps: %w", bin, assets, err)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crdPaths, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, err
	}
	return env, cfg, nil
}

// Policy reads a packaged ValidatingAdmissionPolicy file: the policy, a
// "---" line, and its binding, both decoded strictly.
func Policy(path string) (admissionregistrationv1.ValidatingAdmissionPolicy, admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	var bind admissionregistrationv1.ValidatingAdmissionPolicyBinding
	b, err := os.ReadFile(path)
	if err != nil {
		return pol, bind, err
	}
	docs := strings.Split(string(b), "\n---\n")
	if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), &pol) != nil || yaml.UnmarshalStrict([]byte(docs[1]), &bind) != nil {
		return pol, bind, fmt.Errorf("%s: not a policy and its binding", filepath.Base(path))
	}
	return pol, bind, nil
}

// Eventually polls cond every 50 ms until it holds (true) or d has passed
// (false): the API server applies policies, bindings and caches a moment
// after they are written.
func Eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
