package envd

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// sdkVersion is the E2B SDK the project pins (integration/harness).
const sdkVersion = "2.51.0"

// TestSDKCommands runs E2B's own SDK (npm e2b, JSON codec over HTTP/1.1
// fetch) against envd over the host-process container: commands.run,
// stderr, exit codes, env and cwd, a background command reconnected by
// pid, stdin, kill, a PTY and an unknown user. It is skipped without node
// and the SDK (hack/tools.sh e2b-sdk installs it).
func TestSDKCommands(t *testing.T) {
	dir := os.Getenv("CRYO_TOOLS")
	if dir == "" {
		dir = "/var/cache/cryo/tools"
	}
	sdk := filepath.Join(dir, "e2b-sdk@"+sdkVersion)
	if _, err := os.Stat(filepath.Join(sdk, "node_modules/e2b")); err != nil {
		t.Fatalf("no E2B SDK at %s: install it with hack/tools.sh e2b-sdk (make deps)", sdk)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("no node on PATH: install Node.js (Debian's nodejs)")
	}
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Fatal("no /bin/bash: the SDK runs commands with it (install bash)")
	}
	s, _, c := newProcessTest(t)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	script, err := filepath.Abs("testdata/sdk-commands.mjs")
	if err != nil {
		t.Fatal(err)
	}
	// node resolves 'e2b' from the script's directory upwards: run a copy
	// next to the SDK's node_modules.
	run := filepath.Join(sdk, "envd-sdk-test-"+filepath.Base(t.TempDir())+".mjs")
	b, _ := os.ReadFile(script)
	if err := os.WriteFile(run, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(run) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", run)
	cmd.Env = append(os.Environ(), "ENVD_URL="+ts.URL, "ENVD_TOKEN="+testToken)
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, outb)
	}
	var out struct {
		Run struct {
			Stdout, Stderr string
			ExitCode       int
		}
		Exit struct {
			Error    string
			ExitCode int
		}
		EnvCwd     string
		Background struct {
			Listed   bool
			Seen     string
			ExitCode int
		}
		Stdin       string
		KillUnknown bool
		Kill        struct {
			Killed   bool
			Error    string
			ExitCode int
			Message  string
		}
		Pty   bool
		Ghost struct{ Error string }
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("%v: %s", err, outb)
	}
	t.Logf("%s", outb)
	if out.Run.Stdout != "hello\n" || out.Run.Stderr != "err\n" || out.Run.ExitCode != 0 {
		t.Errorf("run: %+v", out.Run)
	}
	if out.Exit.Error != "CommandExitError" || out.Exit.ExitCode != 3 {
		t.Errorf("exit 3: %+v", out.Exit)
	}
	if want := "bar " + string(c) + "/tmp\n"; out.EnvCwd != want {
		t.Errorf("env and cwd: %q, want %q", out.EnvCwd, want)
	}
	if !out.Background.Listed || out.Background.Seen != "1\n2\n3\n4\n5\n6\n7\n8\n" || out.Background.ExitCode != 0 {
		t.Errorf("background: %+v, want listed and all its output on connect", out.Background)
	}
	if out.Stdin != "to-cat\n" {
		t.Errorf("stdin: %q", out.Stdin)
	}
	if out.KillUnknown {
		t.Error("kill of an unknown pid returned true")
	}
	if !out.Kill.Killed || out.Kill.Error != "CommandExitError" || out.Kill.ExitCode != -1 || out.Kill.Message != "signal: killed" {
		t.Errorf("kill: %+v", out.Kill)
	}
	if !out.Pty {
		t.Error("pty: no 30 100 after the resize")
	}
	if out.Ghost.Error != "AuthenticationError" {
		t.Errorf("unknown user: %+v, want AuthenticationError", out.Ghost)
	}
}
