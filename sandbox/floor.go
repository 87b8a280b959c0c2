package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"
)

// Floor measures the physical limit of a restore on this node: QEMU
// started directly with -incoming from the snapshot's materialized files
// until the guest has run a first command, with nothing fetched (the node
// cache must hold the snapshot) and no containerd, shim or network in the
// time measured. `cryoctl bench` holds restores against it. The VM is gone
// and its directories removed when Floor returns.
func Floor(ctx context.Context, spec Spec, src Source) (time.Duration, error) {
	st := &start{Spec: spec, src: src, restore: &restoring{}}
	var t0 time.Time
	var took time.Duration
	err := runSteps(ctx, "floor", []step{
		{"dirs", func(ctx context.Context, u *undo) error {
			u.cleanup(func(context.Context) { os.RemoveAll(spec.StateDir); os.RemoveAll(spec.DiskDir) })
			return st.stateDir(ctx, u)
		}},
		{"resolve", st.resolve},
		{"check host", st.checkHost},
		{"materialize", st.materialize},
		{"cached", func(ctx context.Context, u *undo) error {
			u.cleanup(func(context.Context) { st.restore.release() })
			if !st.restore.mat.CacheHit {
				return fmt.Errorf("the snapshot was not in the node cache: restore it once first")
			}
			return nil
		}},
		{"vm config", st.restoreConfig},
		{"vm", st.newVM},
		{"clock", func(context.Context, *undo) error { t0 = time.Now(); return nil }},
		{"qemu", func(ctx context.Context, u *undo) error {
			if err := st.startQEMU(ctx, u); err != nil {
				return err
			}
			u.cleanup(func(ctx context.Context) {
				sctx, cancel := context.WithTimeout(ctx, failedStartTimeout)
				defer cancel()
				_ = st.vm.Shutdown(sctx)
			})
			return nil
		}},
		{"load state", st.loadState},
		{"continue", func(ctx context.Context, _ *undo) error { return st.vm.Resume(ctx) }},
		{"agent", st.connectAgent},
		{"first command", func(ctx context.Context, _ *undo) error {
			defer st.agent.close()
			// In the checkpointed sandbox's own container, as an exec
			// would run: the guest's root has no such command.
			out, status, err := st.agent.runHook(ctx, st.restore.rec.SandboxID, []string{"true"}, firstCommandTimeout)
			if err == nil && status != 0 {
				err = fmt.Errorf("true exited %d: %s", status, out)
			}
			took = time.Since(t0)
			return err
		}},
	})
	return took, err
}
