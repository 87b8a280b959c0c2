package guest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// A container's init is PID 1 of its pid namespace, and the kernel drops a
// signal sent to a namespace's init that neither handles it nor blocks it
// (only SIGKILL and SIGSTOP are forced, and only from an ancestor
// namespace). A program that installs its handlers as it starts would lose
// a signal sent right after StartProcess returned: under TCG a shell takes
// hundreds of milliseconds to reach its trap. With runc the window is
// microseconds; here it is not, so such a signal is held instead, and sent
// as soon as the init handles, ignores or blocks it, or exits, or once
// signalHoldWindow has passed since it started: a program that has not set a
// handler by then does not mean to, and the kernel's drop is the answer, as
// with runc. A caught signal also waits until the init has settled (been
// seen asleep once): a handler that is there from the first instruction is
// the runtime's, not the program's (a script's shell catches SIGINT from
// its start and exits 130 on it; its trap comes later; Go's runtime catches
// every signal before main runs). (Kata's agent turns an unhandled SIGTERM to the init into
// SIGKILL, which kills a program that would have handled it a moment later.)
//
// An init made in another container's pid namespace (a pod that shares
// one) is not PID 1: the kernel acts on a signal it does not handle
// (SIGTERM kills it) instead of dropping it. Its signal is held the same
// way: under runc its trap would be there before the signal, and a program
// that handles none gets the default action at the end of the window (a
// process seen asleep may still be on its way to its handler: a script's
// first command).
const (
	signalHoldWindow = 5 * time.Second
	// signalHoldPoll is how often a held signal's target is looked at.
	signalHoldPoll = 5 * time.Millisecond
	// signalBlockedSettle is how long a signal stays blocked, without a
	// handler, before that is taken as the program's way to wait for it.
	signalBlockedSettle = 100 * time.Millisecond
)

// sigMasks are a process's signal sets, from /proc/<pid>/status.
type sigMasks struct {
	caught, ignored, blocked uint64
	// sigwait: the main thread is in sigwait (rt_sigtimedwait), which
	// unblocks the signals it waits for in SigBlk for the time of the call.
	sigwait bool
	// sleeping: the main thread is in an interruptible sleep (State S):
	// the program has reached a wait of its own.
	sleeping bool
}

// readSigMasks reads the signal sets of pid's main thread, the one kill()
// checks.
func readSigMasks(pid int) (sigMasks, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return sigMasks{}, err
	}
	m, err := parseSigMasks(b)
	if err != nil {
		return m, err
	}
	if b, err := os.ReadFile(dir + "/syscall"); err == nil {
		m.sigwait = inSyscall(b, unix.SYS_RT_SIGTIMEDWAIT)
	}
	return m, nil
}

// inSyscall reports whether /proc/<pid>/syscall's content says the thread
// is blocked in syscall nr.
func inSyscall(content []byte, nr int) bool {
	f := bytes.Fields(content)
	return len(f) > 0 && string(f[0]) == strconv.Itoa(nr)
}

func parseSigMasks(status []byte) (sigMasks, error) {
	var m sigMasks
	fields := map[string]*uint64{"SigCgt": &m.caught, "SigIgn": &m.ignored, "SigBlk": &m.blocked}
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if ok && string(name) == "State" {
			m.sleeping = bytes.HasPrefix(bytes.TrimSpace(value), []byte("S"))
			continue
		}
		dst, want := fields[string(name)]
		if !ok || !want {
			continue
		}
		v, err := strconv.ParseUint(string(bytes.TrimSpace(value)), 16, 64)
		if err != nil {
			return sigMasks{}, fmt.Errorf("status %s: %w", name, err)
		}
		*dst = v
		found++
	}
	if found != len(fields) {
		return sigMasks{}, fmt.Errorf("status lacks SigCgt, SigIgn or SigBlk")
	}
	return m, nil
}

// sendVerdict is what becomes of a signal to a namespace's init.
type sendVerdict int

const (
	sendNow sendVerdict = iota
	hold
)

// decideSignal says whether sig, sent to a namespace's init with masks m
// that started age ago, goes now. It goes when the kernel would not drop
// it (forced, caught once the init has settled, or ignored: an ignored
// signal is the program's own choice), or once the window has passed. A blocked signal without a
// handler is held too: the kernel would queue it, but drop it when it is
// unblocked with no handler, and shells block every signal for a moment
// around each fork. It goes when it has stayed blocked for
// signalBlockedSettle: the program waits for it with signalfd, and the
// queued signal is what it wants. One that waits in sigwait (tini) has it
// at once.
func decideSignal(sig unix.Signal, m sigMasks, age, blockedFor time.Duration, settled bool) sendVerdict {
	if sig == unix.SIGKILL || sig == unix.SIGSTOP || sig < 1 || sig > 64 || age >= signalHoldWindow {
		return sendNow
	}
	bit := uint64(1) << (sig - 1)
	switch {
	case m.ignored&bit != 0 || m.sigwait:
		return sendNow
	case m.caught&bit != 0:
		if settled {
			return sendNow
		}
		return hold
	case m.blocked&bit != 0 && blockedFor >= signalBlockedSettle:
		return sendNow
	}
	return hold
}

// holdSignal decides whether sig to the process must wait: only for a
// container's init that has started. p.mu is held. The time sig has been
// seen blocked is tracked in p.blockedSince for the first held signal.
func (p *process) holdSignal(sig unix.Signal, now time.Time) bool {
	if !p.init || p.state != stateRunning || p.startedAt.IsZero() {
		return false
	}
	age := now.Sub(p.startedAt)
	if age >= signalHoldWindow {
		return false
	}
	m, err := readSigMasks(p.pid)
	if err != nil {
		return false // gone: the reaper will tell
	}
	if m.sleeping {
		p.settled = true
	}
	var blockedFor time.Duration
	if sig >= 1 && sig <= 64 && m.blocked&(uint64(1)<<(sig-1)) != 0 {
		if p.blockedSince.IsZero() {
			p.blockedSince = now
		}
		blockedFor = now.Sub(p.blockedSince)
	} else {
		p.blockedSince = time.Time{}
	}
	return decideSignal(sig, m, age, blockedFor, p.settled) == hold
}

// deliverHeld sends the held signals, in order, as each stops being one the
// kernel would drop, or when the window closes; it stops when the process
// exits.
func (p *process) deliverHeld() {
	t := time.NewTicker(signalHoldPoll)
	defer t.Stop()
	for {
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
		if p.sendHeld(time.Now()) {
			return
		}
	}
}

// sendHeld sends what may be sent of the held signals; it reports whether
// none is left.
func (p *process) sendHeld(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateStopped {
		p.held = nil
		return true
	}
	for len(p.held) > 0 && !p.holdSignal(p.held[0], now) {
		sig := p.held[0]
		e := log.L.WithFields(log.Fields{"pid": p.pid, "signal": sig, "held": now.Sub(p.heldSince), "after_start": now.Sub(p.startedAt)})
		if err := unix.Kill(p.pid, sig); err != nil {
			e = e.WithError(err)
		}
		e.Info("held signal sent")
		p.held, p.blockedSince, p.heldSince = p.held[1:], time.Time{}, now
	}
	return len(p.held) == 0
}
