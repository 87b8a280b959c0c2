package guest

import (
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func startReaper(t *testing.T) *Reaper {
	r := NewReaper()
	stop := make(chan struct{})
	go r.Run(stop)
	t.Cleanup(func() { close(stop) })
	return r
}

func waitExit(t *testing.T, ch <-chan Exit) Exit {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported")
		return Exit{}
	}
}

func TestReaperReportsExitStatus(t *testing.T) {
	r := startReaper(t)
	for _, tc := range []struct {
		script string
		want   int
	}{{"exit 3", 3}, {"exit 0", 0}, {"kill -9 $$", 128 + 9}, {"kill -TERM $$", 128 + 15}} {
		ch := make(chan Exit, 1)
		if err := r.Start(exec.Command("/bin/sh", "-c", tc.script), func(e Exit) { ch <- e }); err != nil {
			t.Fatal(err)
		}
		if e := waitExit(t, ch); e.Status != tc.want || e.At.IsZero() {
			t.Errorf("%q: exit %d at %v, want %d", tc.script, e.Status, e.At, tc.want)
		}
	}
}

// Processes that exit at once must not be reaped before they are registered.
func TestReaperNoLostExits(t *testing.T) {
	r := startReaper(t)
	const n = 30
	var wg sync.WaitGroup
	wg.Add(n)
	for i := 0; i < n; i++ {
		if err := r.Start(exec.Command("/bin/true"), func(Exit) { wg.Done() }); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("some exits were lost")
	}
}

// Children nobody registered (orphans re-parented to PID 1) are reaped too.
func TestReaperReapsUnknownChildren(t *testing.T) {
	r := startReaper(t)
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.Reap()
		// once reaped, the pid is gone (ESRCH) rather than a zombie
		if err := unix.Kill(pid, 0); err == unix.ESRCH {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d was not reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
