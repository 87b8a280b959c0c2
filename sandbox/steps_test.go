package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

// TestRunSteps: whichever step fails, the error names the operation and
// that step once and keeps the cause's sentinel; what the earlier steps
// (and the failing one, before it failed) pushed is undone latest first,
// cleanups with it; no later step runs. When none fails only the
// cleanups run, latest first.
func TestRunSteps(t *testing.T) {
	const n = 4
	cause := fmt.Errorf("disk gone: %w", errdefs.ErrUnavailable)
	for fail := -1; fail < n; fail++ {
		var ran, undone []string
		var steps []step
		for i := range n {
			name := fmt.Sprintf("s%d", i)
			steps = append(steps, step{name, func(_ context.Context, u *undo) error {
				ran = append(ran, name)
				u.onFailure(func(context.Context) { undone = append(undone, name) })
				u.cleanup(func(context.Context) { undone = append(undone, name+" cleanup") })
				if i == fail {
					return cause
				}
				return nil
			}})
		}
		err := runSteps(t.Context(), "restore", steps)

		var wantRan, wantUndone []string
		for i := range n {
			if fail >= 0 && i > fail {
				break
			}
			name := fmt.Sprintf("s%d", i)
			wantRan = append(wantRan, name)
			if fail >= 0 {
				wantUndone = append(wantUndone, name)
			}
			wantUndone = append(wantUndone, name+" cleanup")
		}
		slices.Reverse(wantUndone)
		if fail < 0 {
			if err != nil {
				t.Fatalf("no step failed: %v", err)
			}
		} else if want := fmt.Sprintf("restore: s%d: disk gone: unavailable", fail); err == nil || err.Error() != want || !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("step %d failed: error %v, want %q wrapping errdefs.ErrUnavailable", fail, err, want)
		}
		if !slices.Equal(ran, wantRan) {
			t.Errorf("step %d failed: ran %v, want %v", fail, ran, wantRan)
		}
		if !slices.Equal(undone, wantUndone) {
			t.Errorf("step %d failed: undid %v, want %v", fail, undone, wantUndone)
		}
	}
}

// TestRunStepsUndoOutlivesCancel: a restore cancelled by its deadline
// still undoes what it made.
func TestRunStepsUndoOutlivesCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var undoCtxErr error = errors.New("undo did not run")
	err := runSteps(ctx, "boot", []step{
		{"qemu", func(_ context.Context, u *undo) error {
			u.onFailure(func(ctx context.Context) { undoCtxErr = ctx.Err() })
			return nil
		}},
		{"agent", func(ctx context.Context, _ *undo) error { cancel(); return ctx.Err() }},
	})
	if !errors.Is(err, context.Canceled) || err.Error() != "boot: agent: context canceled" {
		t.Fatalf("error %v", err)
	}
	if undoCtxErr != nil {
		t.Errorf("undo ran with a done context (%v): it could not stop QEMU", undoCtxErr)
	}
}
