package vmm

import (
	"os/exec"
	"runtime"
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
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}
