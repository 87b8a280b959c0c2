package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// Floor measures the physical limit of a restore on this node: QEMU
// started directly with -incoming from the snapshot's materialized files
// until the guest has run a first command, with nothing fetched (the node
// cache must hold the snapshot) and no containerd, shim or network in the
// time measured. `cryoctl bench` holds restores against it. The VM is gone
// and its directories removed when Floor returns.
func Floor(ctx context.Context, spec Spec, src Source) (time.Duration, error) {
	spec.RestoreMode = RestoreEager // the materialized files
	st := &start{Spec: spec, src: src, restore: &restoring{}, vms: qemuFactory}
	var took time.Duration
	err := runSteps(ctx, "floor", st.floorSteps(&took))
	return took, err
}

// floorSteps are Restore's without the pod network and the guest's fix-up:
// its fetch (which must find the snapshot in the node cache), its machine,
// then the clock from QEMU's start to a first command.
func (st *start) floorSteps(took *time.Duration) []step {
	var t0 time.Time
	return slices.Concat(
		[]step{{"dirs", func(ctx context.Context, u *undo) error {
			u.cleanup(func(context.Context) { os.RemoveAll(st.StateDir); os.RemoveAll(st.DiskDir) })
			return st.stateDir(ctx, u)
		}}},
		st.fetchSteps(),
		[]step{{"cached", func(ctx context.Context, u *undo) error {
			u.cleanup(func(context.Context) { st.restore.release() })
			if !st.restore.mat.CacheHit {
				return errors.New("the snapshot was not in the node cache: restore it once first")
			}
			return nil
		}}},
		st.machineSteps(),
		[]step{{"clock", func(_ context.Context, u *undo) error {
			// The VM goes when Floor returns, not only when it fails.
			u.cleanup(func(ctx context.Context) {
				sctx, cancel := context.WithTimeout(ctx, failedStartTimeout)
				defer cancel()
				_ = st.vm.Shutdown(sctx)
			})
			t0 = time.Now()
			return nil
		}}},
		st.resumeSteps(),
		[]step{{"first command", func(ctx context.Context, _ *undo) error {
			defer st.agent.close()
			// In the checkpointed sandbox's own container, as an exec
			// would run: the guest's root has no such command.
			out, status, err := st.agent.runHook(ctx, st.restore.rec.SandboxID, []string{"true"}, firstCommandTimeout)
			if err == nil && status != 0 {
				err = fmt.Errorf("true exited %d: %s", status, out)
			}
			*took = time.Since(t0)
			return err
		}}},
	)
}
