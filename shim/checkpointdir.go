package shim

// containerd's checkpoint-directory contract: what a task checkpoint leaves
// in the directory containerd gives it, and how a Create with a checkpoint
// finds its snapshot there.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/snapshot"
)

// refuseCRILocalCheckpoint refuses, before the VM is touched, a checkpoint
// of a Kubernetes pod that names no store. Without one the snapshot would go
// into containerd's checkpoint path as a directory tree (as `ctr c
// checkpoint` carries it), but containerd's CRI CheckpointContainer copies
// only flat files out of that path, and its CreateContainer cannot restore
// from the kubelet's checkpoint archive: a store is the only way back in
// through CRI, so the error says how to name one.
func refuseCRILocalCheckpoint(a map[string]string) error {
	if a[annotations.CRIContainerType] == "" && a[annotations.CRISandboxID] == "" {
		return nil
	}
	return fmt.Errorf("checkpoint of pod %s/%s: no store to publish its vm to: set the pod's %s annotation, or [stores] default_checkpoint_to in the node's cryo config (containerd's CRI keeps only flat files of a checkpoint and cannot restore from the kubelet's archive): %w",
		a[annotations.CRISandboxNamespace], a[annotations.CRISandboxName], annotations.CheckpointTo, errdefs.ErrFailedPrecondition)
}

// taskCheckpointRequest reads containerd's checkpoint request: runc's
// CheckpointOptions (Exit) when present, and where the snapshot goes; made
// is what the sandbox was made from (nil: no sandbox).
func taskCheckpointRequest(r *taskAPI.CheckpointTaskRequest, made *sandbox.Spec) (sandbox.CheckpointRequest, error) {
	var req sandbox.CheckpointRequest
	if r.Options != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err == nil {
			if o, ok := v.(*runcoptions.CheckpointOptions); ok {
				req.Exit = o.Exit
			}
		}
	}
	if made != nil && made.CheckpointTo == "" {
		if err := refuseCRILocalCheckpoint(made.Pod.Annotations); err != nil {
			return req, err
		}
		if r.Path == "" {
			return req, fmt.Errorf("checkpoint: no store configured and no checkpoint path: %w", errdefs.ErrInvalidArgument)
		}
		// The file store follows no symlink in its path: name
		// containerd's directory by its real path.
		dir := r.Path
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		req.To = "file://" + filepath.Join(dir, "snapshot", "cryo") + ":" + localTag
		req.Trusted = true
	}
	return req, nil
}

const localTag = "checkpoint"

func writeCheckpointRef(dir string, req sandbox.CheckpointRequest, res sandbox.CheckpointResult) error {
	if dir == "" {
		return nil
	}
	ref := checkpointRef{URL: res.Ref, Digest: res.Digest}
	if req.Trusted {
		ref = checkpointRef{Local: localTag, Digest: res.Digest}
	}
	b, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, checkpointRefFile), b, 0o600)
}

// checkpointRef is what the task API's Checkpoint leaves in its Path: the
// snapshot's location.
type checkpointRef struct {
	// URL is the store URL with reference; empty when the snapshot is in
	// the checkpoint directory itself (Local).
	URL    string `json:"url,omitempty"`
	Local  string `json:"local,omitempty"` // reference inside <dir>/snapshot
	Digest string `json:"digest"`
}

const checkpointRefFile = "cryo-checkpoint.json"

// readCheckpointRef reads the reference a checkpoint left in containerd's
// checkpoint directory. The directory is containerd's, but its contents
// came from a checkpoint image that anyone may have built: the reference
// is read without following a symlink and decoded strictly
// (decodeCheckpointRef), and the store under it follows no symlink.
func readCheckpointRef(dir string) (sandbox.Source, error) {
	real, err := filepath.EvalSymlinks(dir) // containerd's own path
	if err != nil {
		return sandbox.Source{}, fmt.Errorf("containerd checkpoint %s: %w", dir, err)
	}
	d, err := safefs.OpenDir(real)
	if err != nil {
		return sandbox.Source{}, fmt.Errorf("containerd checkpoint %s: %w", dir, err)
	}
	defer d.Close()
	b, err := d.ReadFile(checkpointRefFile, maxCheckpointRef)
	if err != nil {
		return sandbox.Source{}, fmt.Errorf("containerd checkpoint %s is not a cryo checkpoint: %w", dir, err)
	}
	return decodeCheckpointRef(b, real)
}

// maxCheckpointRef bounds cryo-checkpoint.json (a URL and a digest).
const maxCheckpointRef = 16 << 10

var localTagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// decodeCheckpointRef validates the reference of a checkpoint directory
// (at dir, a resolved path): a local tag from the tag charset, or a URL
// (which the allowlist checks later), and a sha256 digest.
func decodeCheckpointRef(b []byte, dir string) (sandbox.Source, error) {
	var r checkpointRef
	if err := json.Unmarshal(b, &r); err != nil {
		return sandbox.Source{}, fmt.Errorf("parse %s: %v: %w", checkpointRefFile, err, errdefs.ErrInvalidArgument)
	}
	if r.Digest != "" {
		if d, err := digest.Parse(r.Digest); err != nil || d.Algorithm() != digest.SHA256 {
			return sandbox.Source{}, fmt.Errorf("%s: digest %q: not a sha256 digest: %w", checkpointRefFile, r.Digest, errdefs.ErrInvalidArgument)
		}
	}
	if r.Local != "" {
		if !localTagRE.MatchString(r.Local) {
			return sandbox.Source{}, fmt.Errorf("%s: local %q: want %s: %w", checkpointRefFile, r.Local, localTagRE, errdefs.ErrInvalidArgument)
		}
		return sandbox.Source{URL: "file://" + filepath.Join(dir, "snapshot", "cryo") + ":" + r.Local, Digest: r.Digest, Trusted: true}, nil
	}
	if r.URL == "" {
		return sandbox.Source{}, fmt.Errorf("%s names no snapshot: %w", checkpointRefFile, errdefs.ErrInvalidArgument)
	}
	if err := snapshot.CheckText(checkpointRefFile+": url", r.URL, 4096); err != nil {
		return sandbox.Source{}, err
	}
	return sandbox.Source{URL: r.URL, Digest: r.Digest}, nil
}
