package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

type procState int

const (
	stateCreated procState = iota
	stateRunning
	stateStopped
)

func (s procState) String() string {
	return [...]string{"created", "running", "stopped"}[s]
}

// StdioConfig says which streams a process has; Terminal puts all three on a
// pty (stdout carries the output, there is no stderr).
type StdioConfig struct {
	Stdin, Stdout, Stderr, Terminal bool
	// combined sends stderr into the stdout stream (hooks).
	combined bool
	// ptySize, when set, is the terminal's size from the start (envd's
	// processes: a shell reads it once as it starts).
	ptySize *unix.Winsize
}

// process is a container's init or exec process, as the agent tracks it.
type process struct {
	id     string // exec id, "" for init
	cfg    *helperConfig
	stdio  StdioConfig
	stdout *outputBuffer
	stderr *outputBuffer
	exited chan struct{}

	mu      sync.Mutex
	state   procState
	spawned bool // the helper was started (exec processes start once)
	pid     int
	exit    Exit
	stdin   *os.File // pipe write end, or the pty master
	pty     *os.File // pty master (nil without a terminal)
	start   *os.File // init: the helper starts the process when it reads a byte
	// status is the helper's status pipe (see statusMsg).
	status  *bufio.Reader
	closers []io.Closer
	// init: the process is a container's init, whose signals right after
	// its start may be held (signal.go). nsInit: it is PID 1 of its pid
	// namespace, to which the kernel drops unhandled signals; an init made
	// in another container's namespace is not.
	init, nsInit bool
	startedAt    time.Time
	// held are signals waiting for the init to handle them (deliverHeld).
	held         []unix.Signal
	heldSince    time.Time // when the first of held was held
	blockedSince time.Time
	// settled: the init has been seen asleep since it started (signal.go).
	settled bool
	// killRest, set before spawn, ends the rest of the container when its
	// init exits (before the exit is reported): an init that is not PID 1
	// of its pid namespace does not take its processes with it.
	killRest func() error
}

func newProcess(id string, cfg *helperConfig, stdio StdioConfig) *process {
	return &process{
		id: id, cfg: cfg, stdio: stdio,
		stdout: newOutputBuffer(defaultOutputLimit),
		stderr: newOutputBuffer(defaultOutputLimit),
		exited: make(chan struct{}),
	}
}

// spawnOpts is what differs between an init and an exec helper.
type spawnOpts struct {
	cloneflags uintptr
	cgroupFD   int
	extra      []*os.File // from fd 5 on
	// pidNS, when set, is the pid namespace to start the helper in.
	pidNS *os.File
}

// spawn starts the helper for p with its stdio and hands it the config.
func (p *process) spawn(r *Reaper, o spawnOpts) (retErr error) {
	cmd := exec.Command("/proc/self/exe", HelperArg)
	cmd.Args[0] = "cryo-agent"
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: o.cloneflags, UseCgroupFD: o.cgroupFD >= 0, CgroupFD: o.cgroupFD}
	var child []*os.File // the child's ends, closed here once it started
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if retErr != nil {
			p.closeFiles()
		}
	}()
	if err := p.setupStdio(cmd, &child); err != nil {
		return err
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		cfgW.Close()
		return err
	}
	child = append(child, cfgR, statusW)
	p.closers = append(p.closers, statusR)
	cmd.ExtraFiles = append([]*os.File{cfgR, statusW}, o.extra...)

	onExit := func(e Exit) {
		if p.killRest != nil {
			if err := p.killRest(); err != nil && !errors.Is(err, os.ErrNotExist) {
				log.L.WithError(err).Warn("kill the rest of a container whose init exited")
			}
		}
		p.setExited(e)
	}
	start := func() error { return r.Start(cmd, onExit) }
	if o.pidNS != nil {
		err = inPidNamespace(o.pidNS, start)
	} else {
		err = start()
	}
	if err != nil {
		cfgW.Close()
		return fmt.Errorf("start helper: %w", err)
	}
	p.mu.Lock()
	p.pid = cmd.Process.Pid
	p.mu.Unlock()
	cmd.Process.Release()
	p.status = bufio.NewReader(statusR)
	err = json.NewEncoder(cfgW).Encode(p.cfg)
	cfgW.Close()
	if err != nil {
		unix.Kill(p.pid, unix.SIGKILL)
		return fmt.Errorf("send helper config: %w", err)
	}
	return nil
}

// inPidNamespace runs fn on a thread whose children are born in ns. The thread
// is thrown away afterwards (the goroutine ends locked).
func inPidNamespace(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("enter pid namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (p *process) setupStdio(cmd *exec.Cmd, child *[]*os.File) error {
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	*child = append(*child, devnull)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	if p.stdio.Terminal {
		master, slave, err := openPty()
		if err != nil {
			return err
		}
		*child = append(*child, slave)
		p.pty, p.stdin = master, master
		p.closers = append(p.closers, master)
		if sz := p.stdio.ptySize; sz != nil {
			if err := resizePty(master, uint32(sz.Col), uint32(sz.Row)); err != nil {
				return err
			}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		out, err := dupFile(master)
		if err != nil {
			return err
		}
		go pump(out, p.stdout)
		p.stderr.CloseWrite()
		return nil
	}
	if p.stdio.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		*child = append(*child, r)
		p.stdin = w
		p.closers = append(p.closers, w)
		cmd.Stdin = r
	}
	if p.stdio.Stdout {
		w, err := pipeTo(p.stdout, child)
		if err != nil {
			return err
		}
		cmd.Stdout = w
	} else {
		p.stdout.CloseWrite()
	}
	if p.stdio.Stderr && p.stdio.combined && p.stdio.Stdout {
		cmd.Stderr = cmd.Stdout
		p.stderr.CloseWrite()
	} else if p.stdio.Stderr {
		w, err := pipeTo(p.stderr, child)
		if err != nil {
			return err
		}
		cmd.Stderr = w
	} else {
		p.stderr.CloseWrite()
	}
	return nil
}

// pipeTo returns the write end of a pipe whose output is buffered in b.
func pipeTo(b *outputBuffer, child *[]*os.File) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	*child = append(*child, w)
	go pump(r, b)
	return w, nil
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// readStatus waits for the helper's next status: ready (true), gone through
// execve (EOF: false), or failed (error). A helper that hangs past ctx is
// killed.
func (p *process) readStatus(ctx context.Context) (bool, error) {
	type result struct {
		line []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := p.status.ReadBytes('\n')
		ch <- result{line, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		unix.Kill(p.Pid(), unix.SIGKILL)
		<-ch
		return false, fmt.Errorf("waiting for container helper: %w", ctx.Err())
	}
	line, err := r.line, r.err
	if errors.Is(err, io.EOF) && len(line) == 0 {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read helper status: %w", err)
	}
	var m statusMsg
	if err := json.Unmarshal(line, &m); err != nil {
		return false, fmt.Errorf("bad helper status %q: %w", line, err)
	}
	if m.Error != "" {
		return false, errors.New(m.Error)
	}
	return m.Ready, nil
}

// started is called once the helper executed the process.
func (p *process) started(ctx context.Context) error {
	ready, err := p.readStatus(ctx)
	if err == nil && ready {
		err = errors.New("unexpected second ready from helper")
	}
	if err != nil {
		// the helper exits on its own after reporting
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateCreated {
		p.state, p.startedAt = stateRunning, time.Now()
	}
	return nil
}

func (p *process) setExited(e Exit) {
	p.mu.Lock()
	p.state, p.exit = stateStopped, e
	p.mu.Unlock()
	close(p.exited)
}

// Pid returns the guest pid (0 before the helper was spawned).
func (p *process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Wait blocks until the process exited.
func (p *process) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Signal sends sig to the process, or holds it for a container's init that
// has just started and does not handle it yet (see signal.go); an exited
// process is errdefs.ErrNotFound.
func (p *process) Signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateStopped || p.pid == 0 {
		return fmt.Errorf("process %q: %w", p.id, errdefs.ErrNotFound)
	}
	forced := sig == unix.SIGKILL || sig == unix.SIGSTOP
	switch {
	case len(p.held) > 0 && !forced:
		// behind the held ones: signals arrive in the order sent
		p.held = append(p.held, sig)
		return nil
	case p.holdSignal(sig, time.Now()):
		p.held, p.heldSince = append(p.held, sig), time.Now()
		go p.deliverHeld()
		return nil
	}
	return unix.Kill(p.pid, sig)
}

func (p *process) WriteStdin(b []byte) (int, error) {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return 0, fmt.Errorf("process %q has no stdin: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	return w.Write(b)
}

// CloseStdin closes the stdin pipe; with a terminal it does nothing (closing
// the pty master would hang up the session).
func (p *process) CloseStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pty != nil || p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *process) Resize(width, height uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pty == nil {
		return fmt.Errorf("process %q has no terminal: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	return resizePty(p.pty, width, height)
}

// closeFiles releases the agent's ends of the process's pipes.
func (p *process) closeFiles() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.closers {
		c.Close()
	}
	p.closers = nil
	// unblock pumps whose output nobody will read any more
	p.stdout.CloseWrite()
	p.stderr.CloseWrite()
	if p.start != nil {
		p.start.Close()
		p.start = nil
	}
	p.stdin = nil
}
