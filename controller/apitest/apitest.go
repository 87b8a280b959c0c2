// Package apitest starts a real kube-apiserver and etcd for the cluster
// packages' tests (controller-runtime's envtest), from the binaries that
// `make deps` installs. Only tests import it.
package apitest

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
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
