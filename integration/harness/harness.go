// Package harness is the testing.TB face of package stack for the
// integration tests: a private containerd with the cryo runtime, stopped
// and removed in t.Cleanup, and helpers that fail the test instead of
// returning errors.
package harness

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/stack"
)

// Image is the busybox test image every Env imports.
const Image = stack.Image

// Runtime is cryo's runtime type.
const Runtime = configs.RuntimeType

// Watchdog bounds every task API call of the shims an Env starts, except
// Wait: a call that outruns it fails the test with the shim's goroutine
// dump.
const Watchdog = 60 * time.Second

// Env is one private containerd (a stack.Stack) bound to a test.
type Env struct {
	*stack.Stack
	t testing.TB
}

// RepoRoot finds the repository root from the test's working directory.
func RepoRoot(t testing.TB) string {
	d, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Need fails the test unless the named binaries are on PATH, telling what to
// install.
func Need(t testing.TB, path string, bins ...string) {
	t.Helper()
	if err := stack.Need(path, bins...); err != nil {
		t.Fatal(err)
	}
}

// Option changes the cryo config before containerd starts.
type Option func(*configs.Config)

// Start starts a private containerd configured with the cryo runtime; it is
// stopped and removed when the test ends, and leaked processes fail it.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	return start(t, stack.Options{}, opts...)
}

// start is Start with stack options (CRI: see cri.go).
func start(t testing.TB, o stack.Options, opts ...Option) *Env {
	t.Helper()
	for _, f := range opts {
		o.Configure = append(o.Configure, f)
	}
	if o.Watchdog == 0 {
		o.Watchdog = Watchdog
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	s, err := stack.Start(ctx, o)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &Env{Stack: s, t: t}
	stopWatch := e.watchStuckCalls(cancel)
	t.Cleanup(func() {
		stopWatch()
		if keep := os.Getenv("CRYO_KEEP_LOG"); keep != "" {
			// for debugging: keep containerd's (and the shims') log
			if b, err := os.ReadFile(s.LogPath); err == nil {
				_ = os.WriteFile(keep, b, 0o600)
			}
		}
		if err := s.Close(); err != nil {
			t.Errorf("after the test: %v", err)
		}
	})
	return e
}

// WriteConfig writes a cryo config file.
func (e *Env) WriteConfig(path string, c configs.Config) {
	if err := e.Stack.WriteConfig(path, c); err != nil {
		e.t.Fatal(err)
	}
}

// MustCtr runs ctr and fails the test on error.
func (e *Env) MustCtr(args ...string) string {
	e.t.Helper()
	out, err := e.CtrOK(args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// ExitCode returns the exit code of a ctr error.
func ExitCode(err error) int { return stack.ExitCode(err) }

// WaitFor polls cond until it is true or timeout passes.
func WaitFor(timeout time.Duration, cond func() bool) bool { return stack.WaitFor(timeout, cond) }

// watchStuckCalls fails the test as soon as a shim reports a stuck call,
// printing the shim's goroutine dump, and cancels the commands the Env runs
// (ctr, cryoctl) so that the test ends instead of hanging. stop ends the
// watch and checks the log once more.
func (e *Env) watchStuckCalls(cancel context.CancelFunc) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	report := func() bool {
		stuck := e.StuckCalls()
		if len(stuck) == 0 {
			return false
		}
		once.Do(func() {
			for _, r := range stuck {
				e.t.Errorf("a shim call outran the %s watchdog:\n%s", Watchdog, r)
			}
			cancel()
		})
		return true
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if report() {
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		report()
		cancel()
	}
}
