package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Server is a versitygw serving a posix directory, with one empty bucket.
type S3Server struct {
	Endpoint  string // host:port (plain http)
	AccessKey string
	SecretKey string
	Bucket    string
	Dir       string // posix backend directory
	// Transport reaches Endpoint (from the network namespace it is in).
	Transport http.RoundTripper
	cmd       *exec.Cmd
	exited    chan struct{}
}

// S3Options say where StartS3With runs versitygw.
type S3Options struct {
	Tools string // versitygw under bin/ ($CRYO_TOOLS), else PATH
	Dir   string // its data (Dir/s3) and log
	// NetNS, when set, is the network namespace (its path) versitygw runs
	// and listens in: a Stack's, where containerd's shims and the pods of
	// its kubelet reach it.
	NetNS string
	// Addr is where it listens (default: a free port on 127.0.0.1).
	Addr string
}

// StartS3 starts versitygw (from tools/bin or PATH) on 127.0.0.1 with its
// data and log in dir. Close stops it.
func StartS3(ctx context.Context, tools, dir string) (*S3Server, error) {
	return StartS3With(ctx, S3Options{Tools: tools, Dir: dir})
}

// StartS3With starts versitygw as o says and creates its bucket. On error
// nothing is left running.
func StartS3With(ctx context.Context, o S3Options) (_ *S3Server, retErr error) {
	bin, err := LookPath("versitygw", filepath.Join(ToolsDir(o.Tools), "bin")+":"+os.Getenv("PATH"))
	if err != nil {
		return nil, fmt.Errorf("versitygw not found: run `make tools` (hack/tools.sh versitygw)")
	}
	addr := o.Addr
	if addr == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr = l.Addr().String()
		l.Close()
	}
	dir := o.Dir
	s := &S3Server{Endpoint: addr, AccessKey: "cryobench", SecretKey: "cryobench-secret-key", Bucket: "snapshots",
		Dir: filepath.Join(dir, "s3"), exited: make(chan struct{}), Transport: http.DefaultTransport}
	if o.NetNS != "" {
		s.Transport = &http.Transport{DialContext: dialInNetNS(o.NetNS)}
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := []string{bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", addr, "--quiet", "posix", s.Dir}
	if o.NetNS != "" {
		args = append([]string{"nsenter", "--net=" + o.NetNS}, args...)
	}
	s.cmd = exec.Command(args[0], args[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start versitygw: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	c, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1", Transport: s.Transport})
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = c.MakeBucket(cctx, s.Bucket, minio.MakeBucketOptions{Region: "us-east-1"})
		cancel()
		if err == nil || minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
			return s, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "versitygw.log"))
			return nil, fmt.Errorf("versitygw on %s not ready: %w\n%s", addr, err, LastLines(string(b), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Close stops the server.
func (s *S3Server) Close() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
}
