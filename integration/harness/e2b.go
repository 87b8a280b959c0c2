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

// E2BTemplateImage is the image of the E2B tests' template: busybox with
// every applet, a user "user" with home /home/user (E2B's templates'),
// and a /bin/bash, since the SDK runs every command as `/bin/bash -l -c`
// and every PTY as `/bin/bash -i -l`: here busybox's sh under that name.
const E2BTemplateImage = "cryo.local/e2b-base:1"

// ImportE2BTemplate imports E2BTemplateImage into the cluster's
// containerd (both snapshotters, as the test image) and waits until CRI
// lists it.
func (k *K8s) ImportE2BTemplate(t testing.TB) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "e2b-base.tar")
	spec := busybox.Spec{
		Name: E2BTemplateImage, Cmd: []string{"sleep", "inf"}, AllApplets: true,
		Files: []busybox.File{
			{Path: "bin/bash", Mode: 0o755, Content: "#!/bin/sh\nexec /bin/sh \"$@\"\n"},
			{Path: "etc/passwd", Mode: 0o644, Content: "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/sh\n"},
			{Path: "etc/group", Mode: 0o644, Content: "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"},
			{Path: "home/user", Dir: true, Mode: 0o755, UID: 1000, GID: 1000},
			{Path: "root", Dir: true, Mode: 0o700},
		},
	}
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
