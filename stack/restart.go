package stack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// RestartContainerd stops containerd with SIGTERM, as a service manager
// would, and starts it again with the same command line, config and
// environment. The shims, in process groups of their own, and their VMs
// run on; the new containerd reconnects to them.
func (s *Stack) RestartContainerd() error {
	old := s.cmd
	if old == nil || old.Process == nil {
		return errors.New("restart containerd: not running")
	}
	_ = old.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = old.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = old.Process.Kill()
		<-done
	}
	s.cmd = nil
	logf, err := os.OpenFile(s.LogPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(old.Path, old.Args[1:]...)
	cmd.Env, cmd.SysProcAttr = old.Env, old.SysProcAttr
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := s.ctr(s.ctx, 10*time.Second, "version"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not come back:\n%s", s.LogTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
