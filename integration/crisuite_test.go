//go:build integration

package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/internal/busybox"
	"github.com/cryo-runtime/cryo/stack"
)

// crisuiteSkip are the tests of containerd's CRI integration suite that
// cannot run against the cryo handler in the harness's containerd, with
// why; docs/crisuite.md has the same list. Tests that
// fail because of a cryo defect are not here: they must fail until fixed.
var crisuiteSkip = []struct{ test, why string }{
	// They kill containerd by name (pkill -x) and expect a supervisor to
	// start it again; the harness's containerd is not supervised, and a
	// name would match every containerd on the machine.
	{"TestContainerdRestart", "restarts containerd"},
	{"TestImageVolumeSetupIfContainerdRestarts", "restarts containerd"},
	{"TestSandboxStopWithNilCNIResult", "restarts containerd; needs the runc-fp failpoint runtime and CNI plugin"},
	{"TestRunPodSandboxWithShimStartAndTeardownCNIFailure", "restarts containerd; needs the runc-fp failpoint runtime"},
	{"TestRunPodSandboxAndTeardownCNISlow", "restarts containerd; needs the failpoint CNI plugin"},
	{"TestContainerdRestartSandboxRecover", "restarts containerd; needs the runc-fp failpoint runtime"},

	// They start a containerd of their own (default config: runc,
	// /var/lib/containerd-like paths under a temp dir), not the cryo one.
	{"TestContainerCgroupWritable", "starts its own containerd (runc)"},
	{"TestRunContainerWithVolatileOption", "starts its own containerd (runc)"},
	{"TestIssue10244LoopbackV2", "starts its own containerd (runc) and bind-mounts a host binary"},
	{"TestIssue10467", "starts a previous containerd release (downloads it)"},
	{"TestUpgrade", "starts a previous containerd release (downloads it)"},
	{"TestOOMEventMonitor", "starts its own containerd from -build-dir"},
	{"TestReload100Pods", "starts its own containerd (runc) and restarts it"},
	{"TestRuntimeHandlerUnpackWithSnapshotLabels", "starts its own containerd (erofs snapshotter)"},

	// containerd's failpoint shim (runc-fp) and failpoint CNI plugin, which
	// exist only in containerd's CI.
	{"TestIssue7496_ShouldRetryShutdown", "needs the runc-fp failpoint runtime"},
	{"TestPodSandboxController_ShouldBackoffExitEventWhenFail", "needs the runc-fp failpoint runtime"},
	{"TestRunPodSandboxWithSetupCNIFailure", "needs the failpoint CNI plugin"},
	{"TestRunPodSandboxWithShimStartFailure", "needs the runc-fp failpoint runtime"},
	{"TestRunPodSandboxWithShimDeleteFailure", "needs the runc-fp failpoint runtime"},

	// runc-only.
	{"TestKillShimPreservesExitStatusForMultipleContainers", "runs containerd-shim-runc-v2 from -build-dir"},

	// Images or hosts we do not have.
	{"TestCRIImagePullTimeout", "pulls ghcr.io/containerd/volume-ownership by a fixed name through an in-process image service (no internet); tests containerd's puller, not the runtime"},
	{"TestContainerConsumedStats", "runs `stress` from the resource-consumer image, which cannot be built offline (busybox has no stress)"},

	{"TestImageLoad", "saves an image with docker (no docker daemon here)"},

	// VM runtime: a host path bind-mounted into a container is copied into
	// the guest at create, so a write inside never reaches the host.
	{"TestVolumeCopyUp", "checks that a write inside the container reaches the volume's host directory; cryo copies bind mounts into the guest"},
	// VM runtime: the container's cgroup is in the guest, and resizing a
	// running container (in-place resize) is not implemented for a VM.
	{"TestUpdateContainerResources_MemoryLimit", "reads the container's memory limit from the host cgroup of its pid, then resizes it while running"},
	{"TestUpdateContainerResources_StatusUpdated", "resizes a running container (UpdateContainerResources: not implemented for a VM sandbox)"},
	{"TestTruncIndex", "resizes a running container (UpdateContainerResources) among its truncated-id lookups"},
	// VM runtime: the terminal is a pty in the guest; the shim holds no
	// /dev/ptmx on the host.
	{"TestContainerTTYLeakAfterExit", "counts /dev/ptmx descriptors in the shim (lsof); cryo's pty is in the guest"},
	// runc shim's shape: it holds no pipe between calls. cryo's shim always
	// holds the read end of its VM's console pipe.
	{"TestContainerIOLeakAfterStartFailed", "expects the shim to hold no pipe at all (lsof | grep pipe); cryo's shim holds its VM's console pipe"},
}

// crisuiteLoadSensitive are the suite's tests that give the guest a fixed
// wall-clock time for CPU-bound work. Under TCG they pass alone, and can
// miss while the run's other lanes share the two cores: a failure of these
// alone is rerun once, alone (TestContainerdCRISuite).
var crisuiteLoadSensitive = []string{
	// A shell loop of 3×max_container_log_line_size printf iterations
	// must end within 30 s: about 10 s at the suite's 4 KiB.
	"TestLongContainerLog",
}

func onlyLoadSensitive(failed []string) bool {
	for _, f := range failed {
		if !slices.Contains(crisuiteLoadSensitive, f) {
			return false
		}
	}
	return true
}

// TestContainerdCRISuite runs containerd's own CRI integration tests
// (github.com/containerd/containerd/v2/integration, built by
// `hack/tools.sh crisuite` at the containerd version the project installs)
// against the cryo handler: every test but crisuiteSkip, its images built
// from busybox and served by a local registry.
func TestContainerdCRISuite(t *testing.T) {
	const sandboxImage = harness.RegistryAddr + "/pause:3.10.2"
	c := harness.StartCRIWith(t, &harness.CRI{
		RegistryHosts:          harness.RegistryHostsDir(t),
		Pause:                  pauseSpec(sandboxImage),
		DrainExecSyncIOTimeout: "10s", // as in containerd's CI (script/test/utils.sh)
		// TestLongContainerLog prints three lines of about this length a
		// byte at a time from a shell loop, and must end within 30 s: the
		// default 16 KiB took 25-30 s alone under TCG and missed under the
		// other lanes' load; 4 KiB checks the same split at a quarter of
		// the loop.
		MaxContainerLogLineSize: 4096,
		// The suite dials shims at containerd's default socket dir.
		ShimSocketDir: "/run/containerd/s",
		// TestSandboxRemoveWithoutIPLeakage looks for the pod's address
		// in host-local's default store.
		IPAMDir: "/var/lib/cni/networks",
	})
	harness.Need(t, os.Getenv("PATH"), "cri-integration.test")
	imageList := crisuiteImages(t, c, sandboxImage)

	run, skip := "^Test", crisuiteSkipRegexp()
	if r := os.Getenv("CRYO_CRISUITE_RUN"); r != "" {
		run = r
	}
	if s, ok := os.LookupEnv("CRYO_CRISUITE_SKIP"); ok {
		skip = s
	}
	logPath := filepath.Join(os.TempDir(), "cryo-crisuite.log")
	err := runCRISuite(t, c, logPath, imageList, run, skip)
	b, _ := os.ReadFile(logPath)
	res := parseGoTestOutput(string(b))
	t.Logf("containerd CRI suite: %d passed, %d failed, %d skipped", len(res.passed), len(res.failed), len(res.skipped))
	if len(res.failed) > 0 && onlyLoadSensitive(res.failed) {
		// Run alone, as gotestsum's --rerun-fails would: they measure
		// the guest's speed against a fixed time, which the other lanes
		// of the run share. Both outputs are kept when they fail again.
		t.Logf("rerunning alone, once: %s (wall-clock bound under TCG: crisuiteLoadSensitive)", strings.Join(res.failed, ", "))
		first := string(b)
		err = runCRISuite(t, c, logPath, imageList, "^("+strings.Join(res.failed, "|")+")$", "")
		b, _ = os.ReadFile(logPath)
		again := parseGoTestOutput(string(b))
		t.Logf("the rerun: %d passed, %d failed", len(again.passed), len(again.failed))
		res.passed, res.failed = append(res.passed, again.passed...), again.failed
		b = []byte(first + "\n==== the rerun alone\n" + string(b))
		_ = os.WriteFile(logPath, b, 0o644)
	}
	if err != nil || len(res.failed) > 0 {
		if b, rerr := os.ReadFile(c.LogPath); rerr == nil {
			_ = os.WriteFile(filepath.Join(os.TempDir(), "cryo-crisuite-containerd.log"), b, 0o644)
		}
		t.Fatalf("containerd CRI suite failed (%v): %d failed:\n  %s\nfull log: %s (containerd's: %s)\nthe suite's last lines:\n%s\ncontainerd log:\n%s",
			err, len(res.failed), strings.Join(res.failed, "\n  "), logPath,
			filepath.Join(os.TempDir(), "cryo-crisuite-containerd.log"), stack.LastLines(string(b), 15), c.LogTail(20))
	}
	if len(res.passed) == 0 {
		t.Fatalf("the suite passed no test (full log: %s)", logPath)
	}
	os.Remove(logPath) // kept only when the run failed
}

// pauseELF is the sandbox image's /pause, built from testdata/pause.S: it
// sleeps until SIGTERM or SIGINT and then exits 0, as registry.k8s.io/pause
// does. It is 440 bytes and the image holds nothing else: cryo copies an
// image volume into the guest only up to 1 MiB, and the suite's image
// volume tests mount this image.
const pauseELF = "" +
	"f0VMRgIBAQAAAAAAAAAAAAIAPgABAAAAeABAAAAAAABAAAAAAAAAAPgAAAAAAAAAAAAAAEAAOAAB" +
	"AEAAAwACAAEAAAAFAAAAeAAAAAAAAAB4AEAAAAAAAHgAQAAAAAAAaAAAAAAAAABoAAAAAAAAAAgA" +
	"AAAAAAAAuA0AAAC/DwAAAEiNNTcAAAAx0kG6CAAAAA8FuA0AAAC/AgAAAEiNNRwAAAAx0kG6CAAA" +
	"AA8FuCIAAAAPBev3uOcAAAAx/w8FtwBAAAAAAAAAAAAEAAAAALcAQAAAAAAAAAAAAAAAAAAALnNo" +
	"c3RydGFiAC50ZXh0AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" +
	"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACwAAAAEAAAAGAAAAAAAAAHgAQAAAAAAAeAAAAAAA" +
	"AABoAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAEAAAADAAAAAAAAAAAAAAAAAAAAAAAA" +
	"AOAAAAAAAAAAEQAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAA="

func pauseSpec(name string) *busybox.Spec {
	elf, err := base64.StdEncoding.DecodeString(pauseELF)
	if err != nil {
		panic(err)
	}
	return &busybox.Spec{Name: name, Cmd: []string{"/pause"}, Bare: true,
		Files: []busybox.File{{Path: "pause", Mode: 0o755, Content: string(elf)}}}
}

// crisuiteImages builds the suite's images from busybox, pushes them to the
// local registry (removing the local copies, so that the tests pull them
// as they would from ghcr.io), and writes the -image-list file naming them.
func crisuiteImages(t *testing.T, c *harness.CRI, sandboxImage string) string {
	c.StartRegistry()
	sh := []string{"/bin/sh"}
	users := []busybox.File{ // as in the busybox image (TestAdditionalGids looks up wheel and daemon)
		{Path: "etc/passwd", Mode: 0o644, Content: "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\n" +
			"bin:x:2:2:bin:/bin:/bin/false\nsys:x:3:3:sys:/dev:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n"},
		{Path: "etc/group", Mode: 0o644, Content: "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\n" +
			"wheel:x:10:root\nusers:x:100:\nnogroup:x:65534:\n"},
	}
	dir := func(p string) busybox.File { return busybox.File{Path: p, Mode: 0o755, Dir: true} }
	content := func(p string) busybox.File { return busybox.File{Path: p, Mode: 0o644, Content: "test_content\n"} }
	copyUp := []busybox.File{
		dir("test_dir"), content("test_dir/test_file"),
		dir(":colon_prefixed"), content(":colon_prefixed/colon_prefixed_file"),
		dir("C:"), dir("C:/weird_test_dir"), content("C:/weird_test_dir/weird_test_file"),
	}
	specs := []struct {
		field, ref string
		spec       busybox.Spec
	}{
		{"BusyBox", "containerd/busybox:1.36", busybox.Spec{Cmd: sh, AllApplets: true}},
		// Alpine's applets are links to /bin/busybox, which the image
		// volume tests rely on (a subpath through bin/sh escapes).
		{"Alpine", "containerd/alpine:3.14.0", busybox.Spec{Cmd: sh, AllApplets: true, LinkTarget: "/bin/busybox",
			// TestImageVolumeReusableAfterFailure reads it through an image volume.
			Files: []busybox.File{{Path: "etc/os-release", Mode: 0o644, Content: "NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.14.0\n" +
				"PRETTY_NAME=\"Alpine Linux v3.14 (busybox stand-in built by cryo's test)\"\n"}}}},
		{"ResourceConsumer", "e2e-test-images/resource-consumer:1.10", busybox.Spec{Cmd: sh, AllApplets: true}},
		{"Nginx", "containerd/nginx:1.27.0", busybox.Spec{Cmd: []string{"sleep", "inf"}, AllApplets: true}},
		{"VolumeCopyUp", "containerd/volume-copy-up:2.2", busybox.Spec{Cmd: sh, AllApplets: true, Files: copyUp,
			Volumes: []string{"/test_dir", "/:colon_prefixed", "/C:/weird_test_dir"}}},
		{"VolumeOwnership", "containerd/volume-ownership:2.1", busybox.Spec{Cmd: sh, AllApplets: true,
			Files:   []busybox.File{{Path: "test_dir", Mode: 0o755, Dir: true, UID: 65534, GID: 65534}},
			Volumes: []string{"/test_dir"}}},
	}
	var list strings.Builder
	for i, s := range specs {
		local := fmt.Sprintf("cryo.local/crisuite-%d:1", i)
		s.spec.Name = local
		s.spec.Files = append(slices.Clone(users), s.spec.Files...)
		tarPath := filepath.Join(c.Dir, fmt.Sprintf("crisuite-%d.tar", i))
		if err := busybox.WriteSpecFile(tarPath, s.spec); err != nil {
			t.Fatal(err)
		}
		c.MustCtr("image", "import", tarPath)
		full := c.Push(local, s.ref)
		c.MustCtr("image", "rm", local, full)
		fmt.Fprintf(&list, "%s = %q\n", s.field, full)
	}
	// The sandbox image stays: it is pinned, as the suite expects.
	c.Push(sandboxImage, strings.TrimPrefix(sandboxImage, harness.RegistryAddr+"/"))
	fmt.Fprintf(&list, "Pause = %q\n", sandboxImage)
	p := filepath.Join(c.Dir, "crisuite-images.toml")
	if err := os.WriteFile(p, []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func crisuiteSkipRegexp() string {
	names := make([]string, len(crisuiteSkip))
	for i, s := range crisuiteSkip {
		names[i] = s.test
	}
	return "^(" + strings.Join(names, "|") + ")$"
}

// runCRISuite runs the suite binary in containerd's network namespace (its
// tests dial the streaming server on that namespace's 127.0.0.1), its
// output to logPath.
func runCRISuite(t *testing.T, c *harness.CRI, logPath, imageList, run, skip string) error {
	// About 5½ minutes under TCG on 2 shared cores; the suite's own
	// timeout panics first, with its goroutines in the log.
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	args := []string{"--net=" + c.NetNS, "cri-integration.test",
		"-test.v", "-test.timeout", "30m", "-test.run", run,
		"-cri-endpoint", "unix://" + c.Socket, "-runtime-handler", harness.RuntimeHandler,
		"-image-list", imageList,
		// No process has this name: a test that restarts containerd by
		// name fails instead of killing some other containerd.
		"-containerd-bin", "cryo-crisuite-unsupervised-containerd",
	}
	if skip != "" {
		args = append(args, "-test.skip", skip)
	}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = append(os.Environ(), "PATH="+c.Path())
	cmd.Dir = c.Dir
	// nsenter execs the suite in its place: it dies with this test even
	// when go test's own timeout ends the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	err = cmd.Run()
	t.Logf("containerd CRI suite ran for %s", time.Since(start).Round(time.Second))
	return err
}

type goTestResult struct{ passed, failed, skipped []string }

var goTestLine = regexp.MustCompile(`(?m)^--- (PASS|FAIL|SKIP): (\S+)`)

// parseGoTestOutput collects the top-level tests' results from `go test
// -v` output (subtests are indented and left out).
func parseGoTestOutput(out string) goTestResult {
	var r goTestResult
	for _, m := range goTestLine.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "PASS":
			r.passed = append(r.passed, m[2])
		case "FAIL":
			r.failed = append(r.failed, m[2])
		case "SKIP":
			r.skipped = append(r.skipped, m[2])
		}
	}
	return r
}
