// Package watchdog reports calls that run too long: after the bound, it logs
// the call as stuck and asks the process for its goroutine dump (SIGUSR1,
// which containerd's pkg/shim answers by logging every goroutine's stack).
// The shim arms it for its task API calls when the environment names a
// bound; the integration harness does, and fails a test whose log shows a
// stuck call, with the dump, instead of hanging until CI's timeout.
package watchdog

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/containerd/log"
)

// Env names the environment variable that holds the bound (a Go duration).
// containerd passes its environment to its shims.
const Env = "CRYO_SHIM_WATCHDOG"

// StuckMessage is the log message of a call that outran the bound.
const StuckMessage = "task api call is stuck"

// DumpEnd ends the goroutine dump that pkg/shim logs.
const DumpEnd = "=== END goroutine stack dump ==="

// FromEnv returns the bound in Env, or 0 (off).
func FromEnv() time.Duration {
	d, err := time.ParseDuration(os.Getenv(Env))
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// Arm reports call as stuck unless the returned stop is called within
// bound; a bound of 0 arms nothing.
func Arm(ctx context.Context, call string, bound time.Duration) (stop func()) {
	if bound <= 0 {
		return func() {}
	}
	t := time.AfterFunc(bound, func() {
		log.G(ctx).WithFields(log.Fields{"method": call, "running": bound}).Error(StuckMessage)
		_ = syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	})
	return func() { t.Stop() }
}
