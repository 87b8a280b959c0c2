package vmm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
)

// QEMU's lifetime: QEMU is started with exec.Command, never CommandContext, so
// it outlives the request that booted it. It must not outlive the shim
// process, though: a shim killed with SIGKILL cannot serve its VM any more,
// and an orphaned QEMU keeps guest RAM and disks busy until `shim delete`
// runs (which then kills it from qemu.pid, see Cleanup).
//
// So QEMU gets PR_SET_PDEATHSIG=SIGKILL. The kernel sends that signal when
// the *thread* that forked the child exits, not the process, and the Go
// runtime may end threads. All QEMUs are therefore forked from one goroutine
// locked to its OS thread for the life of the process: the signal fires
// exactly when the shim process dies (also on SIGKILL). The containerd shim
// re-exec (`start` spawning the daemon) happens before any QEMU exists, so it
// is unaffected. QEMU also gets its own process group (Setpgid) so that
// signals sent to the shim's group (a terminal's ^C) do not reach it; the
// shim decides when QEMU stops.

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

// spawner forks every QEMU from the same, never-exiting OS thread.
func spawner() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the process
	for r := range spawnCh {
		r.done <- r.cmd.Start()
	}
}

// startQEMU starts cmd with a parent-death signal bound to the process.
func startQEMU(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go spawner()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := closeInheritedOnExec(); err != nil {
		return err
	}
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// command prepares QEMU's files and descriptors and starts it. On failure
// nothing it made is left but the logs.
func (m *Machine) command() (_ *exec.Cmd, retErr error) {
	uid := -1
	if !m.cfg.Confine.Disabled {
		l, err := leaseUID(m.cfg.Confine)
		if err != nil {
			return nil, err
		}
		m.lease, uid = l, l.uid
		if m.cfg.AdmitUID != nil {
			m.cfg.AdmitUID(uid)
		}
	}
	defer func() {
		if retErr != nil {
			m.lease.release()
			m.removeFiles()
		}
	}()
	if m.lease != nil {
		if err := m.lease.own(m.uidFiles()...); err != nil {
			return nil, err
		}
	}
	if err := m.prepareFiles(uid); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(m.path(QEMULogName), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // QEMU has its own copy
	// As QEMU's uid, exec reports a missing binary as "permission denied".
	if _, err := exec.LookPath(m.cfg.QEMUPath); err != nil {
		return nil, err
	}
	files, console, err := m.openSlots()
	defer closeAll(files)
	if err != nil {
		return nil, err
	}
	clog, err := openCappedLog(m.path(ConsoleLogName), m.cfg.ConsoleMaxBytes)
	if err != nil {
		console.Close()
		return nil, fmt.Errorf("console log: %w", err)
	}
	cmd := exec.Command(m.cfg.QEMUPath, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	for _, n := range m.cfg.NICs {
		cmd.ExtraFiles = append(cmd.ExtraFiles, n.Tap)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, files...)
	if uid >= 0 {
		cred, err := credential(uid, m.cfg.Accel)
		if err != nil {
			console.Close()
			clog.Close()
			return nil, err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := startQEMU(cmd); err != nil {
		console.Close()
		clog.Close()
		return nil, fmt.Errorf("spawn %s: %w", m.cfg.QEMUPath, err)
	}
	m.consoleDone = make(chan struct{})
	go pumpConsole(console, clog, m.consoleDone)
	return cmd, nil
}

// openSlots opens the descriptors of m.boot.slots, in order. console is
// the read end of the console pipe (whose write end is in files).
func (m *Machine) openSlots() (files []*os.File, console *os.File, retErr error) {
	defer func() {
		if retErr != nil && console != nil {
			console.Close()
		}
	}()
	for _, s := range m.boot.slots {
		var f *os.File
		var err error
		switch s.kind {
		case fdQMP:
			f, err = listenUnix(m.path(QMPSocketName))
		case fdAgent:
			f, err = listenUnix(m.path(AgentSocketName))
		case fdConsole:
			console, f, err = os.Pipe()
		case fdRAM:
			f, err = m.openRAM()
		case fdKernelStub:
			if f, err = kernelStub(s.path); errors.Is(err, errNoBootHeader) {
				f, err = os.Open(s.path)
			}
		default:
			f, err = os.OpenFile(s.path, s.flag, 0)
		}
		if err != nil {
			return files, console, err
		}
		files = append(files, f)
	}
	return files, console, nil
}

// openRAM opens the RAM file QEMU maps; a sealed one must carry its seals.
func (m *Machine) openRAM() (*os.File, error) {
	f, err := os.OpenFile(m.ramFile(), os.O_RDWR, 0)
	if err != nil || !m.cfg.Memory.Sealed {
		return f, err
	}
	if err := checkSealed(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// listenUnix makes a listening unix socket at path for QEMU to accept on.
func listenUnix(path string) (*os.File, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false) // the socket stays for QEMU; Shutdown removes it
	defer l.Close()
	return l.File()
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own files that way, but the shim inherits descriptors
// without it (the socket containerd's start passes, whatever a parent left
// open), and QEMU must get nothing but its stdio and cmd.ExtraFiles (exec
// duplicates those into place whatever their flags).
func closeInheritedOnExec() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd) // the directory's own descriptor may be gone: no error to check
		}
	}
	return nil
}
