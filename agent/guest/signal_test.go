package guest

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const statusSample = `Name:	sh
State:	S (sleeping)
Pid:	1
SigQ:	0/31457
SigPnd:	0000000000000000
ShdPnd:	0000000000000000
SigBlk:	0000000000010000
SigIgn:	0000000000000004
SigCgt:	0000000000000202
CapInh:	0000000000000000
`

func TestParseSigMasks(t *testing.T) {
	m, err := parseSigMasks([]byte(statusSample))
	if err != nil {
		t.Fatal(err)
	}
	if m != (sigMasks{caught: 0x202, ignored: 0x4, blocked: 0x10000, sleeping: true}) {
		t.Errorf("masks %+v", m)
	}
	if _, err := parseSigMasks([]byte("Name:\tsh\nSigCgt:\t0\n")); err == nil {
		t.Error("a status without SigIgn and SigBlk parsed")
	}
	if _, err := parseSigMasks([]byte("SigCgt:\tzz\nSigIgn:\t0\nSigBlk:\t0\n")); err == nil {
		t.Error("a bad mask parsed")
	}
}

// TestDecideSignal: a signal waits only while the init neither catches
// (once settled) nor ignores it, it is not forced, the window is open, and
// it has not stayed blocked long enough to be waited for.
func TestDecideSignal(t *testing.T) {
	m, _ := parseSigMasks([]byte(statusSample)) // catches SIGUSR1 (10) and SIGINT (2), ignores SIGQUIT (3), blocks SIGCHLD (17)
	for _, tc := range []struct {
		sig        unix.Signal
		age        time.Duration
		blockedFor time.Duration
		want       sendVerdict
	}{
		{unix.SIGUSR1, 0, 0, sendNow}, {unix.SIGINT, 0, 0, sendNow}, {unix.SIGQUIT, 0, 0, sendNow},
		{unix.SIGTERM, 0, 0, hold}, {unix.SIGUSR2, time.Second, 0, hold}, {unix.Signal(64), 0, 0, hold},
		{unix.SIGTERM, signalHoldWindow, 0, sendNow},
		{unix.SIGCHLD, 0, 0, hold}, {unix.SIGCHLD, 0, signalBlockedSettle / 2, hold},
		{unix.SIGCHLD, 0, signalBlockedSettle, sendNow},
		{unix.SIGKILL, 0, 0, sendNow}, {unix.SIGSTOP, 0, 0, sendNow}, {unix.Signal(0), 0, 0, sendNow}, {unix.Signal(65), 0, 0, sendNow},
	} {
		if got := decideSignal(tc.sig, m, tc.age, tc.blockedFor, true); got != tc.want {
			t.Errorf("%v at %v, blocked %v: %v, want %v", tc.sig, tc.age, tc.blockedFor, got, tc.want)
		}
	}
	// Caught from the start, before the init ever slept: the runtime's
	// handler (a script's shell and SIGINT), not the program's yet.
	if decideSignal(unix.SIGINT, m, 0, 0, false) != hold || decideSignal(unix.SIGQUIT, m, 0, 0, false) != sendNow ||
		decideSignal(unix.SIGINT, m, signalHoldWindow, 0, false) != sendNow {
		t.Error("a caught signal to an init that has not settled: want it held, an ignored one sent, and both sent after the window")
	}
	// in sigwait, SigBlk does not show what the thread waits for
	m.sigwait = true
	if decideSignal(unix.SIGTERM, m, 0, 0, false) != sendNow {
		t.Error("a signal to an init in sigwait was held")
	}
	if !inSyscall([]byte("128 0x7ffc 0x0 0x0 0x8 0x0 0x0 0x7ffc 0x7f12\n"), 128) || inSyscall([]byte("running\n"), 128) || inSyscall([]byte("7 0x1\n"), 128) {
		t.Error("inSyscall")
	}
}

// runShell starts sh -c script as if it were a container's init that
// started at started, and returns the process and how it ended.
func runShell(t *testing.T, script string, started time.Time) (*process, <-chan syscall.WaitStatus) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	p := newProcess("", &helperConfig{}, StdioConfig{})
	p.init, p.nsInit, p.pid, p.state, p.startedAt = true, true, cmd.Process.Pid, stateRunning, started
	done := make(chan syscall.WaitStatus, 1)
	go func() {
		cmd.Wait()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		p.setExited(Exit{Status: ws.ExitStatus()})
		done <- ws
	}()
	return p, done
}

// heldEnd waits for the shell of runShell to end, which a held signal
// ends by the close of the window at the latest.
func heldEnd(t *testing.T, done <-chan syscall.WaitStatus) syscall.WaitStatus {
	t.Helper()
	select {
	case ws := <-done:
		return ws
	case <-time.After(signalHoldWindow + 5*time.Second):
		t.Fatal("the held signal never came")
		return 0
	}
}

// notPID1 makes p the init of a container made in another's pid namespace.
func notPID1(p *process) {
	p.mu.Lock()
	p.nsInit = false
	p.mu.Unlock()
}

// trapLate installs its USR1 trap only after a while, as a shell under TCG
// does; the trap exits 7. Not being a namespace's init, the shell dies of a
// USR1 that reaches it before the trap, where an init would drop it: either
// way the trap would not run.
const trapLate = `sleep 0.3; trap 'exit 7' USR1; while :; do sleep 0.05; done`

// TestSignalHeldUntilHandled: signals sent to an init that has just started
// wait for its handler, in order; SIGKILL does not wait.
func TestSignalHeldUntilHandled(t *testing.T) {
	p, done := runShell(t, trapLate, time.Now())
	for range 3 {
		if err := p.Signal(unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
	}
	if ws := heldEnd(t, done); ws.Signaled() || ws.ExitStatus() != 7 {
		t.Fatalf("the shell ended with %v, want exit 7 from its trap", ws)
	}

	p, done = runShell(t, trapLate, time.Now())
	p.Signal(unix.SIGUSR1)
	if err := p.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case ws := <-done:
		if ws.Signal() != unix.SIGKILL {
			t.Fatalf("the shell ended with %v, want SIGKILL at once", ws)
		}
	case <-time.After(200 * time.Millisecond):
		t.Fatal("SIGKILL waited behind a held signal")
	}
}

// TestSignalNotHeldLate: past the window, or for a process that is not a
// namespace's init, the signal goes at once, as the kernel decides.
func TestSignalNotHeldLate(t *testing.T) {
	for name, setup := range map[string]func(p *process){
		"after the window": func(p *process) { p.startedAt = time.Now().Add(-signalHoldWindow) },
		"exec process":     func(p *process) { p.init, p.nsInit = false, false },
	} {
		p, done := runShell(t, trapLate, time.Now())
		p.mu.Lock()
		setup(p)
		p.mu.Unlock()
		if err := p.Signal(unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		select {
		case ws := <-done:
			if ws.Signal() != unix.SIGUSR1 {
				t.Errorf("%s: the shell ended with %v, want killed by SIGUSR1 at once", name, ws)
			}
		case <-time.After(250 * time.Millisecond):
			t.Errorf("%s: the signal was held", name)
		}
	}
}

// TestSignalHeldSharedNamespace: the init of a container made in another's
// pid namespace (not PID 1) has its signal held until its trap is there,
// as PID 1 has; one that never handles it gets it at the end of the window
// and dies of it, as under runc.
func TestSignalHeldSharedNamespace(t *testing.T) {
	p, done := runShell(t, trapLate, time.Now())
	notPID1(p)
	if err := p.Signal(unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if ws := heldEnd(t, done); ws.Signaled() || ws.ExitStatus() != 7 {
		t.Fatalf("the shell ended with %v, want exit 7 from its trap", ws)
	}

	p, done = runShell(t, `sleep 0.3; while :; do sleep 0.05; done`, time.Now())
	notPID1(p)
	start := time.Now()
	if err := p.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := heldEnd(t, done); ws.Signal() != unix.SIGTERM {
		t.Fatalf("the shell ended with %v, want killed by SIGTERM", ws)
	}
	if waited := time.Since(start); waited > signalHoldWindow+time.Second {
		t.Fatalf("SIGTERM reached the shell after %v, want it by the end of the window (%v)", waited, signalHoldWindow)
	}
}

// TestSignalHeldExit: a held signal is dropped when its target exits.
func TestSignalHeldExit(t *testing.T) {
	p, done := runShell(t, `sleep 0.2; exit 3`, time.Now())
	p.Signal(unix.SIGTERM)
	if ws := <-done; ws.ExitStatus() != 3 {
		t.Fatalf("exit %v", ws)
	}
}

// pythonInit starts python3 running script as if it were a container's init
// that just started, once it printed a line; it returns when it exited.
func pythonInit(t *testing.T, script string) (*process, *exec.Cmd) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("no python3 on PATH: install Debian's python3")
	}
	cmd := exec.Command("python3", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	p := newProcess("", &helperConfig{}, StdioConfig{})
	p.init, p.nsInit, p.pid, p.state, p.startedAt = true, true, cmd.Process.Pid, stateRunning, time.Now()
	return p, cmd
}

// TestSignalSigwait: a program that waits for a signal in sigwait, as
// tini does, gets it at once; one that keeps it blocked (to read it from a
// signalfd) gets it once the block has lasted signalBlockedSettle; neither
// waits for the end of the window.
func TestSignalSigwait(t *testing.T) {
	for name, wait := range map[string]string{
		"sigwait":    "signal.sigwait({signal.SIGUSR1})\n",
		"sigpending": "while signal.SIGUSR1 not in signal.sigpending(): time.sleep(0.01)\n",
	} {
		p, cmd := pythonInit(t, "import signal, time\n"+
			"signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"+
			"print('ready', flush=True)\n"+wait+"raise SystemExit(5)")
		sent := time.Now()
		if err := p.Signal(unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		took := time.Since(sent)
		if code := cmd.ProcessState.ExitCode(); code != 5 {
			t.Fatalf("%s: exit %d (%v), want 5", name, code, cmd.ProcessState)
		}
		if took > signalHoldWindow/2 {
			t.Errorf("%s: the signal came after %v", name, took)
		}
		t.Logf("%s: the signal came after %v", name, took)
	}
}

// TestSignalWaitsForSettledInit: a script's shell catches SIGINT from its
// start and exits 130 on it; the script's own trap comes later. A SIGINT
// sent right away waits until the shell first sleeps (in its wait), and the
// trap gets it, as containerd's TestContainerStopSignals expects of a
// SIGINT stop signal.
func TestSignalWaitsForSettledInit(t *testing.T) {
	const script = `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; trap 'exit 0' INT; sleep 30 & wait`
	p, done := runShell(t, script, time.Now())
	if err := p.Signal(unix.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case ws := <-done:
		if ws.Signaled() || ws.ExitStatus() != 0 {
			t.Fatalf("the shell ended with status %d (signal %v), want exit 0 from its trap", ws.ExitStatus(), ws.Signal())
		}
	case <-time.After(signalHoldWindow + 5*time.Second):
		t.Fatal("the held SIGINT never came")
	}
}
