package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
