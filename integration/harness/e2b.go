package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/internal/busybox"
	"github.com/cryo-runtime/cryo/stack"
)

// E2BSDKVersion is the official E2B SDK (npm e2b) the tests drive cryo's
// E2B API with; hack/tools.sh e2b-sdk installs the same.
const E2BSDKVersion = "2.51.0"

// E2BSDK returns the directory holding node_modules/e2b at E2BSDKVersion
// ($CRYO_TOOLS/e2b-sdk@<version>), installing it with npm if missing; it
// fails the test naming what to install when it cannot.
func E2BSDK(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(stack.ToolsDir(""), "e2b-sdk@"+E2BSDKVersion)
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		return dir
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node not found: install Node.js (18 or later) for the E2B SDK tests")
	}
	if out, err := exec.Command("npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "e2b@"+E2BSDKVersion).CombinedOutput(); err != nil {
		t.Fatalf("install the E2B SDK (npm install --prefix %s e2b@%s, or hack/tools.sh e2b-sdk): %v\n%s", dir, E2BSDKVersion, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// E2BTemplateImage is the image of the E2B tests' template "base"
// (busybox.E2BTemplate: busybox with E2B's user and a /bin/bash).
const E2BTemplateImage = "cryo.local/e2b-base:1"

// ImportE2BTemplate imports E2BTemplateImage into the cluster's
// containerd (both snapshotters, as the test image) and waits until CRI
// lists it.
func (k *K8s) ImportE2BTemplate(t testing.TB) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "e2b-base.tar")
	spec := busybox.E2BTemplate(E2BTemplateImage, []string{"sleep", "inf"})
	if err := busybox.WriteSpecFile(img, spec); err != nil {
		t.Fatal(err)
	}
	for _, sn := range []string{"overlayfs", "blockfile"} {
		k.MustCtr("image", "import", "--snapshotter", sn, img)
	}
	if !WaitFor(30*time.Second, func() bool {
		out, _, err := k.Crictl("images", "-q", E2BTemplateImage)
		return err == nil && strings.TrimSpace(out) != ""
	}) {
		t.Fatalf("CRI does not list %s after the import", E2BTemplateImage)
	}
	return E2BTemplateImage
}
