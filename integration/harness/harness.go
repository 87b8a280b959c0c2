// Package harness is the testing.TB face of package stack for the
// integration tests: a private containerd with the cryo runtime, stopped
// and removed in t.Cleanup, and helpers that fail the test instead of
// returning errors.
package harness

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/stack"
)

// Image is the busybox test image every Env imports.
const Image = stack.Image

// Runtime is cryo's runtime type.
const Runtime = stack.Runtime

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

// GuestDir returns the guest image directory (vmlinuz, initrd.img).
func GuestDir(t testing.TB) string {
	d, err := stack.GuestDir("")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// BinDir returns the directory with containerd-shim-cryo-v2 and cryoctl.
func BinDir(t testing.TB) string {
	d, err := stack.BinDir("")
	if err != nil {
		t.Fatal(err)
	}
	return d
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
	s, err := stack.Start(context.WithoutCancel(t.Context()), o)
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{Stack: s, t: t}
	t.Cleanup(func() {
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
