// Package fetchtest starts real store servers for tests (versitygw for S3,
// the CNCF distribution registry, a net/http file server over an OCI
// layout) and holds a conformance suite every stores.Store must pass.
package storetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// ToolsBin is where hack/tools.sh installs the test servers.
func ToolsBin() string {
	if d := os.Getenv("CRYO_TOOLS"); d != "" {
		return filepath.Join(d, "bin")
	}
	return "/var/cache/cryo/tools/bin"
}

// LookTool finds a tool in ToolsBin or PATH, failing the test with what to
// install when it is missing.
func LookTool(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(ToolsBin(), name)
	if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Fatalf("%s not found in %s or PATH: run `make tools` (or hack/tools.sh %s)", name, ToolsBin(), name)
	return ""
}

// FreePort returns a loopback address with a port that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startProcess runs bin with args in its own process group, its output in
// a log file, and kills and reaps it in t.Cleanup. The log is printed when
// the test failed.
func startProcess(t testing.TB, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) did not exit", name, cmd.Process.Pid)
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s log:\n%s", name, lastBytes(b, 4000))
			}
		}
	})
	return cmd
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitFor polls ready until it returns nil or the deadline passes.
func waitFor(t testing.TB, what string, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = ready(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not ready after 30s: %v", what, err)
}

// S3Server is a running versitygw.
type S3Server struct {
	Endpoint  string // 127.0.0.1:port (plain http)
	AccessKey string
	SecretKey string
	Bucket    string // created empty
	Dir       string // posix backend directory
}

// Env returns the STORAGE_<kind>_* variables (kind "S3" or "MINIO") that
// point a store at this server.
func (s *S3Server) Env(kind string) map[string]string {
	p := "STORAGE_" + kind + "_"
	return map[string]string{
		p + "ENDPOINT": s.Endpoint, p + "ACCESS_KEY_ID": s.AccessKey,
		p + "SECRET_ACCESS_KEY": s.SecretKey, p + "BUCKET_NAME": s.Bucket,
		p + "USE_SSL": "false", p + "REGION": "us-east-1",
	}
}

// Client returns a minio-go client for the server.
func (s *S3Server) Client(t testing.TB) *minio.Client {
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartS3 starts versitygw on 127.0.0.1 with a temporary posix backend and
// one empty bucket; it is stopped and removed when the test ends.
func StartS3(t testing.TB) *S3Server {
	t.Helper()
	bin := LookTool(t, "versitygw")
	s := &S3Server{Endpoint: FreePort(t), AccessKey: "cryotest", SecretKey: "cryotest-secret-key", Bucket: "snapshots", Dir: t.TempDir()}
	startProcess(t, "versitygw", bin, "--access", s.AccessKey, "--secret", s.SecretKey,
		"--port", s.Endpoint, "--quiet", "posix", s.Dir)
	c := s.Client(t)
	waitFor(t, "versitygw", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := c.MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{Region: "us-east-1"})
		if err != nil && minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
			return nil
		}
		return err
	})
	return s
}

// StartRegistry starts the distribution registry (filesystem storage,
// deletes enabled) on 127.0.0.1 and returns its host:port.
func StartRegistry(t testing.TB) string {
	t.Helper()
	bin := LookTool(t, "registry")
	dir := t.TempDir()
	addr := FreePort(t)
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), addr)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, "registry", bin, "serve", cfgPath)
	waitFor(t, "registry", func() error {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		return nil
	})
	return addr
}

// ServeDir serves dir with a plain net/http FileServer (which honours Range)
// on 127.0.0.1 and returns its base URL.
func ServeDir(t testing.TB, dir string) string {
	t.Helper()
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return strings.TrimRight(srv.URL, "/")
}

// ServeHandler serves h on 127.0.0.1 and returns its base URL.
func ServeHandler(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
