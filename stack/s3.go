package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Server is a versitygw serving a posix directory on loopback, with one
// empty bucket.
type S3Server struct {
	Endpoint  string // 127.0.0.1:port (plain http)
	AccessKey string
	SecretKey string
	Bucket    string
	Dir       string // posix backend directory
	cmd       *exec.Cmd
	exited    chan struct{}
}

// StartS3 starts versitygw (from tools/bin or PATH) on 127.0.0.1 with its
// data and log in dir. Close stops it.
func StartS3(ctx context.Context, tools, dir string) (_ *S3Server, retErr error) {
	bin, err := LookPath("versitygw", filepath.Join(ToolsDir(tools), "bin")+":"+os.Getenv("PATH"))
	if err != nil {
		return nil, fmt.Errorf("versitygw not found: run `make tools` (hack/tools.sh versitygw)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	s := &S3Server{Endpoint: addr, AccessKey: "cryobench", SecretKey: "cryobench-secret-key", Bucket: "snapshots",
		Dir: filepath.Join(dir, "s3"), exited: make(chan struct{})}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", addr, "--quiet", "posix", s.Dir)
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
	c, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1"})
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
			return nil, fmt.Errorf("versitygw on %s not ready: %w", addr, err)
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
