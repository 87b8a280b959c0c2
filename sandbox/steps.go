package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/log"
)

// step is one named step of a boot, a restore or a checkpoint. A step that
// creates something pushes how to take it back onto the undo stack.
type step struct {
	name string
	do   func(ctx context.Context, u *undo) error
}

// undo is the one stack of what the steps so far created: on failure every
// entry runs, latest first; on success only the cleanups do.
type undo struct {
	entries []undoEntry
}

type undoEntry struct {
	fn     func(ctx context.Context)
	always bool
}

// onFailure takes fn back if a later step fails.
func (u *undo) onFailure(fn func(ctx context.Context)) {
	u.entries = append(u.entries, undoEntry{fn: fn})
}

// cleanup runs fn once the steps end, whether they failed or not.
func (u *undo) cleanup(fn func(ctx context.Context)) {
	u.entries = append(u.entries, undoEntry{fn: fn, always: true})
}

func (u *undo) unwind(ctx context.Context, failed bool) {
	ctx = context.WithoutCancel(ctx)
	for i := len(u.entries) - 1; i >= 0; i-- {
		if e := u.entries[i]; failed || e.always {
			e.fn(ctx)
		}
	}
	u.entries = nil
}

// runSteps runs the steps of what in order, timing and logging each. The
// first failure stops them and unwinds the undo stack. Its error is the
// step's wrapped once as "<what>: <step>: <cause>", so that no step names
// the operation itself; errdefs sentinels in the cause stay visible to
// errors.Is.
func runSteps(ctx context.Context, what string, steps []step) (retErr error) {
	var u undo
	defer func() { u.unwind(ctx, retErr != nil) }()
	start := time.Now()
	for _, s := range steps {
		t0 := time.Now()
		err := s.do(ctx, &u)
		l := log.G(ctx).WithFields(log.Fields{"step": s.name, "duration": time.Since(t0)})
		if err != nil {
			l.WithError(err).Warnf("%s step failed", what)
			return fmt.Errorf("%s: %s: %w", what, s.name, err)
		}
		l.Infof("%s step", what)
	}
	log.G(ctx).WithField("duration", time.Since(start)).Infof("%s done", what)
	return nil
}

// stepErr wraps a step's error with what the step was doing; nil stays nil.
func stepErr(doing string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", doing, err)
}
