package sandbox

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/internal/redact"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// CheckpointRequest asks for a checkpoint of the sandbox.
type CheckpointRequest struct {
	// To is the store URL with its reference; empty: the checkpoint-to
	// annotation or the node default.
	To   string
	Exit bool
	TTL  time.Duration
	// Trusted targets were chosen by the shim (containerd's checkpoint
	// directory), not by a user: the allowlist does not apply.
	Trusted bool
	// Containers are the sandbox's containers, the first one the
	// sandbox's own (its pre-checkpoint hook runs there).
	Containers []Container
	// Finished are the CRI names of the pod's containers that ran and
	// ended (init containers): a restored pod may run them again.
	Finished []string
	// Pod names the pod the sandbox runs, for the snapshot's source info
	// (empty outside Kubernetes).
	Pod PodRef
}

// PodRef names a Kubernetes pod.
type PodRef struct {
	Name, Namespace, UID string
}

// Container is a container of the sandbox, as a checkpoint records it.
type Container struct {
	GuestID string
	Spec    *specs.Spec
	Disk    string // id of its root disk
	// Name is its CRI container name, by which a restored pod's container
	// finds it; Image the image it runs (both empty outside a pod).
	Name, Image string
}

// CheckpointResult is what a checkpoint published.
type CheckpointResult struct {
	Ref         string
	Digest      string
	PauseWindow time.Duration
	Duration    time.Duration
	Stats       snapshot.WriteStats
}

// checkpointing is one checkpoint on its way: the steps fill it.
type checkpointing struct {
	sb        *Sandbox
	req       CheckpointRequest
	wasPaused bool
	to, ref   string
	store     stores.Store
	wopts     snapshot.WriteOptions
	work      string
	cap       *capture
	paths     snapshot.SourcePaths
	res       CheckpointResult
}

// Checkpoint captures the sandbox and publishes it. The VM is stopped only
// while the disks are frozen (external snapshots, no copy), the device state
// is saved and the RAM file is copied (or, with Exit, linked); compression,
// hashing and upload run after it continues. A failure leaves the sandbox
// running (paused, if it was) and the store's previous snapshot at the
// reference intact (publishing tags last).
func (s *Sandbox) Checkpoint(ctx context.Context, req CheckpointRequest) (CheckpointResult, error) {
	state, ok := s.run.beginCheckpoint()
	if !ok {
		return CheckpointResult{}, fmt.Errorf("checkpoint of %s already in progress: %w", s.spec.ID, errdefs.ErrFailedPrecondition)
	}
	defer s.run.endCheckpoint()
	if state == vmStopped {
		return CheckpointResult{}, fmt.Errorf("checkpoint of %s: its vm is stopped: %w", s.spec.ID, errdefs.ErrFailedPrecondition)
	}
	if len(req.Containers) == 0 {
		return CheckpointResult{}, fmt.Errorf("checkpoint: sandbox has no container: %w", errdefs.ErrFailedPrecondition)
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", s.spec.ID))
	c := &checkpointing{sb: s, req: req, wasPaused: state == vmPaused, res: CheckpointResult{}}
	start := time.Now()
	err := runSteps(ctx, "checkpoint", []step{
		{"target", c.target},
		{"prepare guest", c.prepareGuest},
		{"work dir", c.workDir},
		{"capture", c.capture},
		{"flatten", c.flatten},
		{"publish", c.publish},
		{"finish", c.finish},
	})
	if err != nil {
		return CheckpointResult{}, err
	}
	c.res.Duration = time.Since(start)
	st := c.res.Stats
	log.G(ctx).WithFields(log.Fields{
		"ref": c.to, "digest": c.res.Digest, "pause_window": c.res.PauseWindow, "duration": c.res.Duration,
		"raw_bytes": st.RawBytes, "stored_bytes": st.StoredBytes, "uploaded_bytes": st.UploadedBytes,
		"delta_chunks": st.Deltas, "reused_chunks": st.Reused,
	}).Info("checkpoint published")
	return c.res, nil
}

// target opens the store the checkpoint goes to, with the options of the
// sandbox's tenant and its page index.
func (c *checkpointing) target(ctx context.Context, _ *undo) error {
	sb := c.sb
	to := c.req.To
	if to == "" {
		to = sb.spec.CheckpointTo
	}
	if to == "" {
		return fmt.Errorf("no store: set %s, [stores] default_checkpoint_to, or pass a target: %w", annotations.CheckpointTo, errdefs.ErrInvalidArgument)
	}
	if !c.req.Trusted {
		if err := sb.spec.Node.Stores.Allows(to, sb.spec.Tenant); err != nil {
			return err
		}
	}
	// Every refusal comes before the store is opened: opening a file://
	// store creates its layout, and a refused checkpoint leaves nothing.
	wopts, err := sb.spec.Node.Keys.WriteOptions(sb.spec.Tenant)
	if err != nil {
		return err
	}
	if u, err := url.Parse(to); err == nil {
		if _, ref, err := stores.SplitRef(u.Path); err == nil && ref == "" {
			return fmt.Errorf("%s names no reference (add :tag): %w", redact.URL(to), errdefs.ErrInvalidArgument)
		}
	}
	store, ref, err := stores.Open(ctx, to, storeOptions(sb.spec.Node.Stores, sb.spec.Tenant, to, c.req.Trusted))
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	if ref == "" {
		return fmt.Errorf("%s names no reference (add :tag): %w", redact.URL(to), errdefs.ErrInvalidArgument)
	}
	usePageIndex(ctx, sb, to, &wopts)
	c.to, c.ref, c.store, c.wopts = to, ref, store, wopts
	return nil
}

// prepareGuest runs the pre-checkpoint hook and syncs the guest's
// filesystems. containerd pauses a task before it checkpoints it, but the
// guest must run for both: a paused VM runs until the capture stops it
// again and leaves it stopped for containerd's Resume.
func (c *checkpointing) prepareGuest(ctx context.Context, u *undo) error {
	sb := c.sb
	if c.wasPaused {
		if err := sb.vm.Resume(ctx); err != nil {
			return err
		}
		u.onFailure(func(ctx context.Context) { c.repause(ctx) })
	}
	if err := runHook(ctx, sb.agent, c.req.Containers[0].GuestID, sb.spec.PreCheckpoint, "pre-checkpoint"); err != nil {
		return err
	}
	return stepErr("sync guest filesystems", sb.agent.sync(ctx))
}

// repause stops a VM that was paused before the checkpoint again.
func (c *checkpointing) repause(ctx context.Context) {
	if err := c.sb.vm.Pause(ctx); err != nil {
		log.G(ctx).WithError(err).Error("pause vm again after failed checkpoint")
	}
}

// workDir is where the capture's files live until they are published.
func (c *checkpointing) workDir(ctx context.Context, u *undo) error {
	dir := c.sb.spec.Node.WorkDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	work, err := os.MkdirTemp(dir, ".ckpt-")
	if err != nil {
		return err
	}
	c.work = work
	u.cleanup(func(context.Context) { os.RemoveAll(work) })
	return nil
}

// capture is the pause window.
func (c *checkpointing) capture(ctx context.Context, u *undo) error {
	cp, err := captureVM(ctx, c.sb, c.record(), c.work, c.req.Exit, c.keepsStopped())
	if err != nil {
		return err
	}
	c.cap = cp
	u.cleanup(func(context.Context) { cp.cleanup() })
	u.onFailure(func(ctx context.Context) { c.sb.mem.lost(ctx, cp) })
	if c.req.Exit && !c.wasPaused {
		// With exit the VM stays stopped; if publishing fails, the sandbox
		// must run on as it did before the checkpoint.
		u.onFailure(func(ctx context.Context) {
			if err := c.sb.vm.Resume(ctx); err != nil {
				log.G(ctx).WithError(err).Error("resume vm after failed checkpoint")
			}
		})
	}
	log.G(ctx).WithFields(log.Fields{"pause_window": cp.pause, "exit": c.req.Exit}).WithFields(cp.parts.fields()).Info("checkpoint captured")
	c.res.PauseWindow = cp.pause
	return nil
}

func (c *checkpointing) flatten(ctx context.Context, _ *undo) (err error) {
	c.paths, err = c.cap.flatten(ctx, c.work)
	return err
}

// publish packs the captured files and writes them to the store, tags
// last. The guest memory adds what its capture needs (a served RAM is
// written as its parent's chunks and the pages the guest wrote since) and
// learns what was published (the parent of a served RAM's next
// checkpoint).
func (c *checkpointing) publish(ctx context.Context, _ *undo) error {
	md := c.metadata()
	wopts := c.wopts
	wopts.AnnotateUploaded = true
	if !c.keepsStopped() {
		wopts.Workers, wopts.Yield = besideGuest(c.cap.vcpus(), runtime.GOMAXPROCS(0)), true
	}
	ram := c.sb.mem.writing(ctx, c, &md, &wopts)
	src, err := snapshot.NewSource(md, c.paths)
	if err != nil {
		return err
	}
	defer src.Close()
	src.Files = append(ram, src.Files...)
	desc, stats, err := snapshot.Write(ctx, c.store, c.ref, src, wopts)
	if err != nil {
		return fmt.Errorf("%s: %w", redact.URL(c.to), err)
	}
	c.res.Ref, c.res.Digest, c.res.Stats = c.to, desc.Digest.String(), stats
	c.sb.mem.published(ctx, c, desc, stats)
	return nil
}

// keepsStopped says the VM stays stopped after the pause window: it was
// paused through the task API, or the checkpoint ends it.
func (c *checkpointing) keepsStopped() bool { return c.wasPaused || c.req.Exit }

// besideGuest is how many workers a checkpoint of a guest that runs on
// compresses with: the cores of procs its vCPUs leave, at least one; they
// also run at a lower priority than the vCPUs (snapshot.WriteOptions.Yield).
// Measured on 2 cores with a guest rewriting its RAM as fast as it can
// (docs/performance.md): the writer ran at 0.27-0.33 of its idle speed
// during a checkpoint with two workers at the normal priority, at
// 0.46-0.55 with one; the checkpoint takes longer instead.
func besideGuest(vcpus, procs int) int {
	return max(procs-vcpus, 1)
}

// finish ends a sandbox checkpointed with exit: its processes exit with
// the VM.
func (c *checkpointing) finish(ctx context.Context, _ *undo) error {
	if !c.req.Exit {
		return nil
	}
	if err := c.sb.vm.Shutdown(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("stop vm after checkpoint")
	}
	c.sb.run.set(vmStopped)
	return nil
}

// runHook runs a hook command (sh -c) inside a guest container; a failure
// returns the hook's output.
func runHook(ctx context.Context, ag agentConn, guestID, cmd, name string) error {
	if cmd == "" {
		return nil
	}
	out, status, err := ag.runHook(ctx, guestID, []string{"/bin/sh", "-c", cmd}, hookTimeout)
	if err != nil {
		return fmt.Errorf("%s hook: %w", name, err)
	}
	if status != 0 {
		return fmt.Errorf("%s hook %q exited %d: %s: %w", name, cmd, status, out, errdefs.ErrFailedPrecondition)
	}
	log.G(ctx).WithField("hook", name).Debug("hook ran")
	return nil
}
