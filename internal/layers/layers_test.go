// Package layers holds only a test: the guard of the package layering that
// the README's Design section states ("No package imports one above it").
package layers

import (
	"go/build"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// order is cryo's packages from the bottom layer up. A package imports only
// packages of lower layers, never one of its own layer or above. A pattern
// ending in "/..." is the directory and everything under it. A new package
// must be placed here (the test fails until it is); a package that needs a
// sibling of its layer moves up a layer of its own.
var order = [][]string{
	// helpers with one job each
	{"internal/..."},
	// leaves: no cryo imports beyond internal/
	{"fingerprint", "network", "pagefs", "vmm/qmp", "vmm/devstate", "agent/api/v1", "agent/session", "shim/api/v1", "api/v1alpha1",
		"agent/envd/spec", "agent/envd/spec/process", "agent/envd/spec/filesystem", "controller/apitest",
		// the controller's manifests it checks the cluster against
		"packaging/kubernetes/controller"},
	// envd's generated Connect services, then envd, E2B's sandbox-side API,
	// which the guest agent serves
	{"agent/envd/spec/process/processconnect", "agent/envd/spec/filesystem/filesystemconnect"},
	{"agent/envd"},
	// the stores, the VMM driver, the guest agent
	{"stores", "vmm", "agent", "agent/guest", "vmm/qmp/qmptest"},
	// the node's verified blobs and materialized snapshots
	{"nodecache", "stores/storetest"},
	// the snapshot format
	{"snapshot"},
	// the node's TOML (mapped onto the option structs of the layers below),
	// a snapshot as a single file
	{"configs", "snapshot/archive"},
	// a lazy restore's guest RAM, served from a snapshot
	{"sandbox/servedram"},
	// a shared clone's guest RAM: the node's base, its checkpoints
	// against the served RAM's parent
	{"sandbox/sharedram"},
	// what a pod asks for, checked against the node's config
	{"annotations"},
	// one pod's VM; the cluster's controller (a wing of its own)
	{"sandbox", "controller"},
	// E2B's API over the Checkpoint resource (the cluster wing)
	{"e2bapi"},
	// the node's TOML mapped onto a sandbox's node options
	{"nodeopts"},
	// containerd's side
	{"shim"},
	{"shim/plugin", "stack"},
	{"bench", "integration/harness"},
	// entry points, tools, integration tests
	{"cmd/...", "hack/...", "integration"},
}

// apart are pairs of package sets that never import each other, whatever
// their layers: storage never needs QEMU (a node cache or a snapshot reader
// runs in cryoctl with no VM), nor the VMM driver the snapshot format (the
// fingerprint package is what they share).
var apart = [][2][]string{
	{{"stores/...", "nodecache", "snapshot/..."}, {"vmm/..."}},
	{clusterSide, {"shim/...", "sandbox/...", "vmm/...", "agent/...", "pagefs", "network", "nodecache", "configs"}},
}

// clusterSide is the wing that talks to the Kubernetes API. It may import
// only clusterMay of cryo's packages: what it needs to read and tag
// snapshots in a store, never the VM or the shim.
var (
	clusterSide = []string{"api/...", "controller/...", "e2bapi/...", "cmd/cryo-controller"}
	clusterMay  = []string{"api/...", "controller/...", "e2bapi/...", "stores", "snapshot", "annotations", "internal/...", "packaging/kubernetes/controller"}
)

// kubernetesAllowed are the packages that may import Kubernetes client
// libraries (k8s.io/..., sigs.k8s.io/...): the cluster side and the test
// cluster's tooling. The node side (everything else, above all the shim)
// never does, so its binaries do not grow by the client libraries.
var kubernetesAllowed = append([]string{"stack", "integration/...", "bench", "hack/..."}, clusterSide...)

// nodeCommands are the node's binaries, checked through their whole
// dependency graph (go list -deps), module dependencies included.
var nodeCommands = []string{"cmd/containerd-shim-cryo-v2", "cmd/cryoctl", "cmd/cryo-agent"}

// testOnly are packages that exist for tests; no command imports them.
var testOnly = []string{"stores/storetest", "vmm/qmp/qmptest", "integration/..."}

const module = "github.com/cryo-runtime/cryo"

func TestLayers(t *testing.T) {
	imports := readImports(t)
	layer := map[string]int{}
	for pkg := range imports {
		l := layerOf(pkg)
		if l < 0 {
			t.Errorf("%s is in no layer: place it in order (internal/layers/layers_test.go)", pkg)
		}
		layer[pkg] = l
	}
	for pkg, deps := range imports {
		for _, dep := range deps {
			if layer[pkg] >= 0 && layer[dep] >= layer[pkg] {
				t.Errorf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", pkg, layer[pkg], dep, layer[dep])
			}
			for _, a := range apart {
				if matches(pkg, a[0]) && matches(dep, a[1]) || matches(pkg, a[1]) && matches(dep, a[0]) {
					t.Errorf("%s imports %s: %v and %v are kept apart", pkg, dep, a[0], a[1])
				}
			}
		}
	}
}

func TestCommandsImportNoTestCode(t *testing.T) {
	imports := readImports(t)
	for pkg := range imports {
		if !matches(pkg, []string{"cmd/..."}) {
			continue
		}
		seen := map[string]string{} // package -> the package that imports it
		queue := []string{pkg}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, dep := range imports[p] {
				if _, ok := seen[dep]; ok {
					continue
				}
				seen[dep] = p
				queue = append(queue, dep)
				if matches(dep, testOnly) {
					t.Errorf("%s imports the test package %s (through %s)", pkg, dep, p)
				}
			}
		}
	}
}

func TestClusterSideImportsOnlyStoresAndSnapshot(t *testing.T) {
	imports := readImports(t)
	for pkg, deps := range imports {
		if !matches(pkg, clusterSide) {
			continue
		}
		for _, dep := range deps {
			if !matches(dep, clusterMay) {
				t.Errorf("%s imports %s: the cluster side imports only %v of cryo", pkg, dep, clusterMay)
			}
		}
	}
}

func TestNodeSideImportsNoKubernetes(t *testing.T) {
	all := readAllImports(t)
	if !slices.ContainsFunc(all["controller"], isKubernetes) {
		t.Fatalf("controller imports %v: no Kubernetes package, the guard reads the wrong imports", all["controller"])
	}
	for pkg, deps := range all {
		if matches(pkg, kubernetesAllowed) {
			continue
		}
		for _, dep := range deps {
			if isKubernetes(dep) {
				t.Errorf("%s imports %s: only %v may import Kubernetes libraries", pkg, dep, kubernetesAllowed)
			}
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range nodeCommands {
		for _, tags := range []string{"", "integration"} {
			c := exec.Command("go", "list", "-deps", "-tags", tags, "./"+cmd)
			c.Dir = root
			out, err := c.Output()
			if err != nil {
				t.Fatalf("go list -deps ./%s: %v", cmd, err)
			}
			for _, dep := range strings.Fields(string(out)) {
				if isKubernetes(dep) {
					t.Errorf("%s depends on %s (go list -deps -tags %q): the node's binaries link no Kubernetes library", cmd, dep, tags)
				}
			}
		}
	}
}

func isKubernetes(importPath string) bool {
	return strings.HasPrefix(importPath, "k8s.io/") || strings.HasPrefix(importPath, "sigs.k8s.io/")
}

// TestGuardSeesAViolation: the guard reads real imports (it would pass
// vacuously on an empty graph).
func TestGuardSeesAViolation(t *testing.T) {
	imports := readImports(t)
	if !slices.Contains(imports["sandbox"], "vmm") || !slices.Contains(imports["nodecache"], "stores") {
		t.Fatalf("imports of sandbox %v, nodecache %v: the guard reads the wrong graph", imports["sandbox"], imports["nodecache"])
	}
	if layerOf("vmm") >= layerOf("sandbox") || layerOf("nodecache") <= layerOf("stores") || layerOf("no/such") != -1 {
		t.Fatal("layerOf does not follow order")
	}
}

// readImports returns, for every package of the module (by path relative
// to the module), the module's packages its non-test files import, with
// and without the integration build tag.
func readImports(t *testing.T) map[string][]string {
	t.Helper()
	all := readAllImports(t)
	imports := map[string][]string{}
	for pkg, deps := range all {
		own := []string{}
		for _, imp := range deps {
			if rel, in := strings.CutPrefix(imp, module+"/"); in && !slices.Contains(own, rel) {
				own = append(own, rel)
			}
		}
		imports[pkg] = own
	}
	return imports
}

// readAllImports returns, for every package of the module (by path
// relative to the module), every import path its non-test files import,
// with and without the integration build tag.
func readAllImports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module "+module+"\n") {
		t.Fatalf("%s is not the module's root: %v", root, err)
	}
	imports := map[string][]string{}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil && p != root {
			return filepath.SkipDir // a module of its own (hack/k8s, hack/etcd)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		deps, ok, err := dirImports(p)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
		}
		if ok {
			imports[filepath.ToSlash(rel)] = deps
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(imports) < 20 {
		t.Fatalf("found %d packages under %s", len(imports), root)
	}
	return imports
}

// dirImports are the import paths the non-test files in dir import; ok
// is false when dir holds no package.
func dirImports(dir string) (deps []string, ok bool, err error) {
	for _, tags := range [][]string{nil, {"integration"}} {
		ctxt := build.Default
		ctxt.BuildTags = tags
		pkg, err := ctxt.ImportDir(dir, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				continue
			}
			return nil, false, err
		}
		ok = ok || len(pkg.GoFiles)+len(pkg.CgoFiles) > 0
		for _, imp := range pkg.Imports {
			if !slices.Contains(deps, imp) {
				deps = append(deps, imp)
			}
		}
	}
	return deps, ok, nil
}

// layerOf is the index in order of pkg's layer, -1 if none.
func layerOf(pkg string) int {
	for i, l := range order {
		if matches(pkg, l) {
			return i
		}
	}
	return -1
}

// matches says whether pkg is one of patterns.
func matches(pkg string, patterns []string) bool {
	for _, p := range patterns {
		if dir, tree := strings.CutSuffix(p, "/..."); tree {
			if pkg == dir || strings.HasPrefix(pkg, dir+"/") {
				return true
			}
		} else if pkg == path.Clean(p) {
			return true
		}
	}
	return false
}
