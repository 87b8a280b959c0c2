package guest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/agent/envd"
)

// criContainerType is set by containerd's CRI plugin: "sandbox" for the
// pod's pause container, "container" for the pod's own.
const criContainerType = "io.kubernetes.cri.container-type"

// envdRequest reads whether a container asks for envd: a pod container
// (not the pause container, which carries the pod's annotations too) with
// the token hash annotation. The spec is the tenant's: a bad hash is an
// error naming the annotation.
func envdRequest(spec *specs.Spec) (hash [sha256.Size]byte, ok bool, err error) {
	v, set := spec.Annotations[envd.Annotation]
	if !set || spec.Annotations[criContainerType] != "container" {
		return hash, false, nil
	}
	if hash, err = envd.ParseTokenHash(v); err != nil {
		return hash, false, fmt.Errorf("annotation %s: %w: %w", envd.Annotation, err, errdefs.ErrInvalidArgument)
	}
	return hash, true, nil
}

// startEnvd serves envd for c on envd.Port of every address of the guest
// (the pod's), once per guest: the first container that asks has it.
func (s *Service) startEnvd(ctx context.Context, c *container, hash [sha256.Size]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.envd != nil {
		// A container the kubelet restarts is a new one: envd moves over
		// once the one it served has ended.
		if old := s.envdTarget.get(); old.init.stateIs(stateStopped) || s.containers[old.id] != old {
			s.envdTarget.set(c)
			log.G(ctx).WithFields(log.Fields{"id": c.id, "was": old.id}).Info("envd serves a new container")
			return nil
		}
		log.G(ctx).WithField("id", c.id).Warn("envd serves another container of this sandbox already")
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(envd.Port)))
	if err != nil {
		return fmt.Errorf("start envd for %s: %w", c.id, err)
	}
	logger := log.L.WithField("component", "envd")
	s.envdTarget = &envdContainer{c: c, reaper: s.reaper}
	srv := &http.Server{
		Handler: envd.New(s.envdTarget, hash).Handler(),
		// No WriteTimeout: process output streams for as long as the
		// process runs. envd bounds each write of a stream instead.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          stdlog.New(logger.WriterLevel(log.WarnLevel), "", 0),
	}
	s.envd = srv
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.WithError(err).Error("envd stopped")
		}
	}()
	log.G(ctx).WithFields(log.Fields{"id": c.id, "port": envd.Port}).Info("envd serving")
	return nil
}

// envdContainer is a container as envd sees it: processes are exec'd into
// it like the host's execs, through the helper (its namespaces, root and
// cgroup, the init's capabilities, rlimits and no_new_privs).
type envdContainer struct {
	reaper *Reaper

	mu sync.Mutex
	c  *container
}

func (e *envdContainer) get() *container {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c
}

func (e *envdContainer) set(c *container) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.c = c
}

var _ envd.Container = (*envdContainer)(nil)

func (e *envdContainer) Root() (string, error) {
	c := e.get()
	if c.init.stateIs(stateStopped) {
		return "", fmt.Errorf("container %s has stopped", c.id)
	}
	return fmt.Sprintf("/proc/%d/root", c.init.Pid()), nil
}

func (e *envdContainer) Process() envd.ProcessSpec {
	p := e.get().init.cfg.Process
	return envd.ProcessSpec{UID: p.UID, GID: p.GID, Groups: p.AdditionalGids, Env: p.Env}
}

func (e *envdContainer) Spawn(ctx context.Context, cmd envd.Command) (envd.Process, error) {
	c := e.get()
	pc := c.init.cfg.Process
	pc.Args, pc.Env, pc.Cwd = cmd.Args, cmd.Env, cmd.Dir
	pc.UID, pc.GID, pc.AdditionalGids = cmd.UID, cmd.GID, cmd.Groups
	pc.OOMScoreAdj = nil
	stdio := StdioConfig{Stdin: cmd.Stdin, Stdout: true, Stderr: true}
	if cmd.PTY != nil {
		stdio.Terminal, stdio.ptySize = true, &unix.Winsize{Col: cmd.PTY.Cols, Row: cmd.PTY.Rows}
	}
	p := newProcess("envd", &helperConfig{Mode: helperExec, Process: pc}, stdio)
	if _, err := c.startExec(ctx, e.reaper, p); err != nil {
		p.closeFiles()
		return nil, err
	}
	pid, err := nsPid(p.Pid())
	if err != nil {
		return nil, err
	}
	return &envdProcess{p: p, pid: pid}, nil
}

// nsPid is the pid of a process in its own pid namespace, the one the
// container's processes (and so the SDK's user) see.
func nsPid(pid int) (uint32, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
			return uint32(n), err
		}
	}
	return 0, fmt.Errorf("no NSpid in /proc/%d/status", pid)
}

// envdProcess is an exec process of the agent seen as an envd.Process.
type envdProcess struct {
	p   *process
	pid uint32
}

func (e *envdProcess) Pid() uint32 { return e.pid }

func (e *envdProcess) Stdin() io.WriteCloser {
	if !e.p.stdio.Stdin && !e.p.stdio.Terminal {
		return nil
	}
	return stdinWriter{e.p}
}

func (e *envdProcess) Stdout() io.Reader { return bufferReader{e.p.stdout} }

func (e *envdProcess) Stderr() io.Reader {
	if e.p.stdio.Terminal {
		return nil
	}
	return bufferReader{e.p.stderr}
}

func (e *envdProcess) Wait() envd.Exit {
	x, _ := e.p.Wait(context.Background())
	return envd.Exit{Code: x.Status, Signal: x.Signal}
}

func (e *envdProcess) Signal(sig syscall.Signal) error {
	err := e.p.Signal(sig)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("%w: %w", err, os.ErrProcessDone)
	}
	return err
}

func (e *envdProcess) Resize(s envd.WindowSize) error {
	return e.p.Resize(uint32(s.Cols), uint32(s.Rows))
}

func (e *envdProcess) Release() { e.p.closeFiles() }

type stdinWriter struct{ p *process }

func (w stdinWriter) Write(b []byte) (int, error) { return w.p.WriteStdin(b) }
func (w stdinWriter) Close() error                { return w.p.CloseStdin() }

// bufferReader reads an output buffer as a stream.
type bufferReader struct{ b *outputBuffer }

func (r bufferReader) Read(p []byte) (int, error) {
	data, eof, err := r.b.Read(context.Background(), len(p))
	if err != nil {
		return 0, err
	}
	if len(data) == 0 && eof {
		return 0, io.EOF
	}
	return copy(p, data), nil
}
