package shim

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/fetch"
	"github.com/cryo-runtime/cryo/snapshot"
)

// checkpointRequest asks for a checkpoint of the sandbox.
type checkpointRequest struct {
	// To is the store URL with its reference; empty: the checkpoint-to
	// annotation or the node default.
	To   string
	Exit bool
	TTL  time.Duration
	// trusted targets were chosen by the shim (containerd's checkpoint
	// directory), not by a user: the allowlist does not apply.
	trusted bool
}

type checkpointResult struct {
	Ref         string
	Digest      string
	PauseWindow time.Duration
	Duration    time.Duration
	Stats       snapshot.WriteStats
}

// checkpoint captures the sandbox and publishes it. The VM is stopped only
// while the disks are frozen (external snapshots, no copy), the device state
// is saved and the RAM file is copied (or, with Exit, linked); compression,
// hashing and upload run after it continues. A failure leaves the sandbox
// running and the store's previous snapshot at the reference intact
// (publishing tags last).
func (s *service) checkpoint(ctx context.Context, req checkpointRequest) (_ checkpointResult, retErr error) {
	start := time.Now()
	sb := s.sandbox
	if sb == nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: no sandbox: %w", errdefs.ErrFailedPrecondition)
	}
	if !sb.checkpointing.CompareAndSwap(false, true) {
		return checkpointResult{}, fmt.Errorf("checkpoint of %s already in progress: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	defer sb.checkpointing.Store(false)
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", sb.id))

	to := req.To
	if to == "" {
		to = sb.req.CheckpointTo
	}
	if to == "" {
		return checkpointResult{}, fmt.Errorf("checkpoint: no store: set %s, [stores] default_checkpoint_to, or pass a target: %w", annotations.CheckpointTo, errdefs.ErrInvalidArgument)
	}
	tenant := s.tenant(sb.annotations)
	if !req.trusted {
		if err := sb.cfg.Stores.Allows(to, tenant); err != nil {
			return checkpointResult{}, fmt.Errorf("checkpoint: %w", err)
		}
	}
	store, ref, err := fetch.Open(ctx, to, storeOptions(sb.cfg, tenant, to, req.trusted))
	if err != nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: open store: %w", err)
	}
	if ref == "" {
		return checkpointResult{}, fmt.Errorf("checkpoint target %s names no reference (add :tag): %w", to, errdefs.ErrInvalidArgument)
	}
	wopts, err := sb.cfg.Snapshot.WriteOptions(tenant)
	if err != nil {
		return checkpointResult{}, err
	}
	usePageIndex(ctx, sb, to, &wopts)

	if s.userPaused() {
		// containerd pauses a task before it checkpoints it; the guest must
		// run for the hook and the sync. The capture stops it again and
		// leaves it stopped for containerd's Resume.
		if err := sb.vm.Resume(ctx); err != nil {
			return checkpointResult{}, fmt.Errorf("checkpoint: %w", err)
		}
	}
	c := s.firstContainer()
	if c == nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: sandbox has no container: %w", errdefs.ErrFailedPrecondition)
	}
	if err := runHook(ctx, sb, c.guestID, sb.req.PreCheckpoint, "pre-checkpoint"); err != nil {
		return checkpointResult{}, err
	}
	if err := sb.agent.sync(ctx); err != nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: sync guest filesystems: %w", err)
	}

	work, err := os.MkdirTemp(sb.cfg.Snapshot.CacheDir, ".ckpt-")
	if err != nil {
		if err := os.MkdirAll(sb.cfg.Snapshot.CacheDir, 0o700); err != nil {
			return checkpointResult{}, err
		}
		if work, err = os.MkdirTemp(sb.cfg.Snapshot.CacheDir, ".ckpt-"); err != nil {
			return checkpointResult{}, err
		}
	}
	defer os.RemoveAll(work)
	cap, err := s.capture(ctx, sb, work, req.Exit)
	if err != nil {
		return checkpointResult{}, err
	}
	defer cap.cleanup()
	if req.Exit {
		// With exit the VM stays stopped; if publishing fails, the sandbox
		// must run on as it did before the checkpoint.
		defer func() {
			if retErr != nil {
				if err := sb.vm.Resume(context.WithoutCancel(ctx)); err != nil {
					log.G(ctx).WithError(err).Error("resume vm after failed checkpoint")
				}
			}
		}()
	}
	log.G(ctx).WithFields(log.Fields{"pause_window": cap.pause, "exit": req.Exit}).Info("checkpoint captured")

	paths, err := cap.flatten(ctx, work)
	if err != nil {
		return checkpointResult{}, err
	}
	md := s.metadata(sb, cap, req.TTL)
	src, err := snapshot.NewSource(md, paths)
	if err != nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer src.Close()
	desc, stats, err := snapshot.Write(ctx, store, ref, src, wopts)
	if err != nil {
		return checkpointResult{}, fmt.Errorf("checkpoint: publish to %s: %w", to, err)
	}
	if req.Exit {
		// The sandbox ends with its checkpoint: its processes exit with the
		// VM (the monitor publishes their exits).
		if err := sb.vm.Shutdown(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("stop vm after checkpoint")
		}
	}
	res := checkpointResult{Ref: to, Digest: desc.Digest.String(), PauseWindow: cap.pause, Duration: time.Since(start), Stats: stats}
	log.G(ctx).WithFields(log.Fields{
		"ref": to, "digest": res.Digest, "pause_window": cap.pause, "duration": res.Duration,
		"raw_bytes": stats.RawBytes, "stored_bytes": stats.StoredBytes, "uploaded_bytes": stats.UploadedBytes,
		"delta_chunks": stats.Deltas,
	}).Info("checkpoint published")
	return res, nil
}

// runHook runs a hook command (sh -c) inside a guest container; a failure
// returns the hook's output.
func runHook(ctx context.Context, sb *sandbox, guestID, cmd, name string) error {
	if cmd == "" {
		return nil
	}
	out, status, err := sb.agent.runHook(ctx, guestID, []string{"/bin/sh", "-c", cmd}, 60*time.Second)
	if err != nil {
		return fmt.Errorf("%s hook: %w", name, err)
	}
	if status != 0 {
		return fmt.Errorf("%s hook %q exited %d: %s: %w", name, cmd, status, out, errdefs.ErrFailedPrecondition)
	}
	log.G(ctx).WithField("hook", name).Debug("hook ran")
	return nil
}

// firstContainer is the container that booted the sandbox, or any.
func (s *service) firstContainer() *container {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandbox != nil {
		if c, ok := s.containers[s.sandbox.id]; ok {
			return c
		}
	}
	for _, c := range s.containers {
		return c
	}
	return nil
}
