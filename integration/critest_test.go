//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// critestFocus and critestSkip select the part of cri-tools' validation
// suite that a VM runtime can pass; docs/critest.md says
// why each skipped group is skipped.
var (
	critestFocus = strings.Join([]string{
		`Runtime info`,
		`PodSandbox runtime should support basic operations`,
		`PodSandbox runtime should support metrics operations`,
		`PodSandbox runtime should support sysctls`,
		`Container runtime should support basic operations`,
		`Container runtime should support log`,
		`Container runtime should support adding volume`,
		`Idempotence`,
		`Streaming runtime should support streaming interfaces`,
		`Networking runtime should support networking`,
		`Container OOM`,
		`Security Context bucket`,
		`Security Context SeccompProfilePath`,
	}, "|")
	critestSkip = strings.Join([]string{
		`portforward`,           // the port is in the guest, not in the pod netns containerd enters
		`port mapping`,          // hostPort: needs the CNI portmap plugin and a web server image
		`RemoveImage`,           // image tests pull registry images by name
		`execSync with timeout`, // needs pgrep, which busybox-static lacks
		`adding capability`,     // needs brctl in the image
		`MaskedPaths`,           // see docs/critest.md
		`Privileged is true`,    // host devices
		`seccomp default|seccomp localhost|blocks setting hostname`, // the guest applies no seccomp profile
	}, "|")
)

// TestCritest runs cri-tools' critest against the cryo runtime handler:
// `critest --runtime-handler cryo` with the focus and skip above, its test
// image served by a local registry.
func TestCritest(t *testing.T) {
	c := harness.StartCRIWith(t, &harness.CRI{RegistryHosts: harness.RegistryHostsDir(t)})
	harness.Need(t, os.Getenv("PATH"), "critest")
	const image = "e2e-test-images/busybox:1.29-2"
	c.StartRegistry(image)
	images := filepath.Join(c.Dir, "critest-images.yaml")
	ref := harness.RegistryAddr + "/" + image
	if err := os.WriteFile(images, []byte(fmt.Sprintf("defaultTestContainerImage: %s\nwebServerTestImage: %s\n", ref, ref)), 0o644); err != nil {
		t.Fatal(err)
	}
	focus, skip := critestFocus, critestSkip
	if f := os.Getenv("CRYO_CRITEST_FOCUS"); f != "" {
		focus = f
	}
	if s := os.Getenv("CRYO_CRITEST_SKIP"); s != "" {
		skip = s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+c.NetNS, "critest",
		"--runtime-endpoint", "unix://"+c.Socket, "--image-endpoint", "unix://"+c.Socket,
		"--runtime-handler", harness.RuntimeHandler, "--test-images-file", images,
		"--ginkgo.focus", focus, "--ginkgo.skip", skip, "--ginkgo.no-color", "--ginkgo.v")
	logPath := filepath.Join(os.TempDir(), "cryo-critest.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Dir
	err = cmd.Run()
	b, _ := os.ReadFile(logPath)
	out := string(b)
	m := regexp.MustCompile(`Ran (\d+) of (\d+) Specs`).FindStringSubmatch(out)
	summary := regexp.MustCompile(`(?m)^(SUCCESS|FAIL)!.*$`).FindString(out)
	t.Logf("critest: %s; %s", strings.TrimSpace(firstOr(m, "")), summary)
	if err != nil {
		if b, rerr := os.ReadFile(c.LogPath); rerr == nil {
			_ = os.WriteFile(filepath.Join(os.TempDir(), "cryo-critest-containerd.log"), b, 0o644)
		}
		fails := regexp.MustCompile(`(?m)^\s*\[FAIL\].*$`).FindAllString(out, -1)
		t.Fatalf("critest failed: %v (full log: %s)\n%s\ncontainerd log:\n%s", err, logPath, strings.Join(fails, "\n"), c.LogTail(20))
	}
	if m == nil {
		t.Fatalf("no critest summary in its output (full log: %s)", logPath)
	}
	if ran, _ := strconv.Atoi(m[1]); ran < 30 {
		t.Fatalf("critest ran only %d specs", ran)
	}
	os.Remove(logPath) // kept only when the run failed
}

func firstOr(m []string, d string) string {
	if len(m) == 0 {
		return d
	}
	return m[0]
}
