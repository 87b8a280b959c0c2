package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/vmm/qmp"
)

// Timeouts applied when the caller's context has no deadline.
const (
	DefaultStartTimeout    = 30 * time.Second // spawn to QMP ready
	DefaultCommandTimeout  = 30 * time.Second // one QMP command
	DefaultShutdownTimeout = 10 * time.Second // quit to exit, before SIGKILL
)

// Machine is one QEMU process. Its methods are safe for concurrent use.
type Machine struct {
	cfg    Config
	args   []string
	chains []*image // cfg.Disks' backing chains
	boot   bootFDs

	mu       sync.Mutex
	started  bool
	cmd      *exec.Cmd
	mon      *qmp.Client
	version  string
	cpuFlags []string          // host CPU flags the guest's CPU model uses (KVM)
	disks    []Disk            // attached now, hot-plugged ones with Port set
	nodes    map[string]string // disk id -> top block node
	nodeSeq  int
	fdSeq    int
	fdsets   map[string][]int // disk id -> the fd sets of its images
	lastSet  int              // highest fd set id in use
	lease    *uidLease        // the uid QEMU runs as; nil when not confined
	running  bool             // Start succeeded
	stopping bool             // Shutdown asked QEMU to exit
	paused   bool             // Pause stopped the vCPUs and no Resume ran since
	migSet   string           // the migration capabilities and parameters last set (setMigration)

	shutdownMu sync.Mutex // serializes Shutdown

	exited  chan struct{} // closed once QEMU was reaped
	exitErr error         // set before exited is closed

	consoleDone chan struct{} // closed once the console pump ended

	fpOnce sync.Once
	fp     digests
}

// New validates cfg and returns a machine ready to Start. Validation errors
// wrap errdefs.ErrInvalidArgument.
func New(cfg Config) (*Machine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var chains []*image
	for _, d := range cfg.Disks {
		c, err := imageChain(d.Path, d.Format)
		if err != nil {
			return nil, fmt.Errorf("%w: vm config: disk %s: %v", errdefs.ErrInvalidArgument, d.ID, err)
		}
		chains = append(chains, c)
	}
	args, boot := buildArgs(cfg, chains)
	m := &Machine{
		cfg:     cfg,
		args:    args,
		chains:  chains,
		boot:    boot,
		disks:   append([]Disk(nil), cfg.Disks...),
		nodes:   make(map[string]string),
		fdsets:  make(map[string][]int),
		lastSet: boot.lastSet,
		exited:  make(chan struct{}),
	}
	for i, d := range cfg.Disks {
		m.nodes[d.ID] = nodeName(d.ID)
		m.fdsets[d.ID] = boot.diskSets[i]
	}
	return m, nil
}

// Config returns the machine's configuration with defaults applied.
func (m *Machine) Config() Config { return m.cfg }

// Args returns QEMU's argv without the program name.
func (m *Machine) Args() []string { return append([]string(nil), m.args...) }

// Pid returns QEMU's pid, 0 before Start.
func (m *Machine) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.cmd.Process == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Exited is closed once QEMU has exited and was reaped.
func (m *Machine) Exited() <-chan struct{} { return m.exited }

// Wait blocks until QEMU has exited or ctx is done. It returns nil when QEMU
// exited cleanly or because of Shutdown, an error with QEMU's stderr tail
// otherwise. It is safe to call from many goroutines.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.exited:
		return m.exitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Machine) path(name string) string { return filepath.Join(m.cfg.StateDir, name) }

// Start spawns QEMU, records its pid in the state directory and connects
// QMP, all before ctx's deadline (DefaultStartTimeout without one). On any
// failure QEMU is killed, the files it made are removed and the error carries
// QEMU's stderr. Start runs once. qemu.log is truncated; console.log is
// appended to (a restored guest continues the same console).
//
// A cold boot runs the guest at once; a restored machine waits, paused, for
// LoadState.
func (m *Machine) Start(ctx context.Context) (retErr error) {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return fmt.Errorf("start vm %s: %w: already started", m.cfg.ID, errdefs.ErrFailedPrecondition)
	}
	m.started = true
	m.mu.Unlock()

	ctx, cancel := withDefaultTimeout(ctx, DefaultStartTimeout)
	defer cancel()
	wrap := func(err error) error { return fmt.Errorf("start vm %s: %w", m.cfg.ID, err) }

	cmd, err := m.command()
	if err != nil {
		m.closeExited(err)
		return wrap(err)
	}
	m.mu.Lock()
	m.cmd = cmd
	stopping := m.stopping
	m.mu.Unlock()
	go m.reap(cmd)

	l := log.G(ctx).WithFields(log.Fields{"id": m.cfg.ID, "qemu_pid": cmd.Process.Pid})
	defer func() {
		if retErr != nil {
			m.kill()
			<-m.exited
			m.mu.Lock()
			if m.mon != nil {
				m.mon.Close()
				m.mon = nil
			}
			m.mu.Unlock()
			m.removeFiles()
			retErr = wrap(fmt.Errorf("%w%s", retErr, stderrSuffix(m.Stderr())))
			l.WithError(retErr).Warn("qemu start failed")
		}
	}()
	if stopping {
		return errors.New("shut down while starting")
	}
	if err := m.writeRecords(cmd.Process.Pid); err != nil {
		return err
	}
	mon, err := m.connect(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.mon = mon
	m.mu.Unlock()
	var v struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if err := m.execute(ctx, "query-version", nil, &v); err != nil {
		return err
	}
	flags, err := m.cpuModelFlags(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.version = fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro)
	m.cpuFlags = flags
	m.running = true
	m.mu.Unlock()
	l.WithField("memory", m.cfg.Memory.Mode).Debug("qemu started")
	return nil
}

// connect dials the QMP socket until it answers, QEMU exits or ctx ends.
func (m *Machine) connect(ctx context.Context) (*qmp.Client, error) {
	sock := m.path(QMPSocketName)
	for {
		select {
		case <-m.exited:
			return nil, m.exitedDuringStart()
		default:
		}
		if _, err := os.Stat(sock); err == nil {
			mon, err := qmp.Dial(ctx, sock)
			if err == nil {
				return mon, nil
			}
			select {
			case <-m.exited:
				return nil, m.exitedDuringStart()
			default:
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("connect qmp: %w", err)
			}
		}
		select {
		case <-m.exited:
			return nil, m.exitedDuringStart()
		case <-ctx.Done():
			return nil, fmt.Errorf("connect qmp %s: %w", sock, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// exitedDuringStart explains why QEMU is gone before Start finished.
func (m *Machine) exitedDuringStart() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping {
		return errors.New("shut down while starting")
	}
	return errors.New("qemu exited")
}

// reap waits for QEMU and publishes how it ended.
func (m *Machine) reap(cmd *exec.Cmd) {
	err := cmd.Wait()
	if m.lease != nil {
		m.disownFiles()
		m.lease.release() // no process of the uid is left: QEMU cannot fork
	}
	<-m.consoleDone
	m.mu.Lock()
	stopping, running := m.stopping, m.running
	m.mu.Unlock()
	if err != nil && !stopping {
		err = fmt.Errorf("qemu for vm %s exited: %w%s", m.cfg.ID, err, stderrSuffix(m.Stderr()))
		if running { // a failing Start reports for itself
			log.L.WithFields(log.Fields{"id": m.cfg.ID, "qemu_pid": cmd.Process.Pid}).WithError(err).Warn("qemu exited unexpectedly")
		}
	} else {
		err = nil
	}
	m.closeExited(err)
}

func (m *Machine) closeExited(err error) {
	m.exitErr = err
	close(m.exited)
}

// kill sends SIGKILL to a QEMU that was not reaped yet. (os.Process signals
// through a pidfd, so a reaped pid is never hit by mistake.)
func (m *Machine) kill() {
	m.mu.Lock()
	m.stopping = true
	cmd := m.cmd
	m.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Kill()
	}
}

// Kill sends QEMU SIGKILL at once, for when it cannot be asked (its page
// server is stuck); Shutdown still reaps it and removes its files.
func (m *Machine) Kill() { m.kill() }

// Pause stops the guest's vCPUs (QMP stop).
func (m *Machine) Pause(ctx context.Context) error {
	if err := m.execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause vm %s: %w", m.cfg.ID, err)
	}
	m.setPaused(true)
	return nil
}

func (m *Machine) setPaused(p bool) {
	m.mu.Lock()
	m.paused = p
	m.mu.Unlock()
}

func (m *Machine) isPaused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// Resume runs the guest's vCPUs (QMP cont), also after LoadState or SaveState.
func (m *Machine) Resume(ctx context.Context) error {
	var refused error
	for {
		err := m.execute(ctx, "cont", nil, nil)
		if err == nil {
			m.setPaused(false)
			return nil
		}
		if refused != nil && ctx.Err() != nil {
			// The deadline cut a retry short: QEMU's refusal says why.
			return fmt.Errorf("resume vm %s: %w", m.cfg.ID, refused)
		}
		// QEMU reports a migration completed before its migration thread
		// has left the finish-migrate run state, and refuses cont until it
		// has: a keep-running checkpoint that resumes at once can meet it.
		if !strings.Contains(err.Error(), "Migration is not finalized yet") {
			return fmt.Errorf("resume vm %s: %w", m.cfg.ID, err)
		}
		refused = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("resume vm %s: %w", m.cfg.ID, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Status returns QEMU's run state ("running", "paused", "inmigrate",
// "postmigrate", ...).
func (m *Machine) Status(ctx context.Context) (string, error) {
	var st struct{ Status string }
	if err := m.execute(ctx, "query-status", nil, &st); err != nil {
		return "", fmt.Errorf("status of vm %s: %w", m.cfg.ID, err)
	}
	return st.Status, nil
}

// Shutdown stops QEMU: QMP quit, SIGKILL if it has not exited by ctx's
// deadline (DefaultShutdownTimeout without one); then it removes the
// sockets, the pid file and an owned RAM file. It is idempotent and safe to
// call on a machine that never started or already exited.
//
// quit is a hard stop for the guest (QEMU flushes its own block caches, the
// guest's page cache is lost): ask the guest agent to sync or power off
// first for a clean stop.
func (m *Machine) Shutdown(ctx context.Context) error {
	m.shutdownMu.Lock()
	defer m.shutdownMu.Unlock()
	m.mu.Lock()
	started, cmd, mon := m.started, m.cmd, m.mon
	m.stopping = true
	m.mu.Unlock()
	if !started || cmd == nil {
		return nil // never started, or Start failed and cleaned up
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultShutdownTimeout)
	defer cancel()
	select {
	case <-m.exited:
	default:
		if mon == nil { // still starting: nothing to ask politely
			m.kill()
		} else {
			qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
			// quit may answer or just close the socket; the exit is what counts.
			mon.Execute(qctx, "quit", nil)
			qcancel()
		}
		select {
		case <-m.exited:
		case <-ctx.Done():
			log.G(ctx).WithField("id", m.cfg.ID).Warn("qemu did not quit in time, killing it")
			m.kill()
			select {
			case <-m.exited:
			case <-time.After(10 * time.Second): // SIGKILL of an uninterruptible process
				return fmt.Errorf("shutdown vm %s: qemu pid %d did not die", m.cfg.ID, cmd.Process.Pid)
			}
		}
	}
	if mon != nil {
		mon.Close()
	}
	if err := m.removeFiles(); err != nil {
		return fmt.Errorf("shutdown vm %s: %w", m.cfg.ID, err)
	}
	return nil
}

// execute runs a QMP command and decodes its return value into out (if not
// nil), bounded by DefaultCommandTimeout when ctx has no deadline.
func (m *Machine) execute(ctx context.Context, cmd string, args, out any) error {
	mon, err := m.monitor()
	if err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultCommandTimeout)
	defer cancel()
	ret, err := mon.Execute(ctx, cmd, args)
	if err != nil {
		return m.explain(cmd, err)
	}
	if out != nil {
		if err := jsonUnmarshal(ret, out); err != nil {
			return fmt.Errorf("decode %s reply: %w", cmd, err)
		}
	}
	return nil
}

// monitor returns the QMP client of a running machine.
func (m *Machine) monitor() (*qmp.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mon == nil {
		return nil, fmt.Errorf("%w: vm %s is not running", errdefs.ErrFailedPrecondition, m.cfg.ID)
	}
	return m.mon, nil
}

// explain adds QEMU's stderr to err when QEMU died under the command.
func (m *Machine) explain(cmd string, err error) error {
	if errors.Is(err, qmp.ErrClosed) {
		select {
		case <-m.exited: // the socket error itself says nothing useful
			return fmt.Errorf("%s: %w: qemu exited%s", cmd, qmp.ErrClosed, stderrSuffix(m.Stderr()))
		case <-time.After(time.Second):
		}
	}
	return err
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
