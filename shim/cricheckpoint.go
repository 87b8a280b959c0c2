package shim

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/annotations"
)

// refuseCRILocalCheckpoint refuses, before the VM is touched, a checkpoint
// of a Kubernetes pod that names no store. Without one the snapshot would go
// into containerd's checkpoint path as a directory tree (as `ctr c
// checkpoint` carries it), but containerd's CRI CheckpointContainer copies
// only flat files out of that path, and its CreateContainer cannot restore
// from the kubelet's checkpoint archive: a store is the only way back in
// through CRI, so the error says how to name one.
func refuseCRILocalCheckpoint(sb *sandbox) error {
	a := sb.annotations
	if a[criContainerType] == "" && a[criSandboxID] == "" {
		return nil
	}
	return fmt.Errorf("checkpoint of pod %s/%s: no store to publish its vm to: set the pod's %s annotation, or [stores] default_checkpoint_to in the node's cryo config (containerd's CRI keeps only flat files of a checkpoint and cannot restore from the kubelet's archive): %w",
		a[criSandboxNamespace], a[criSandboxName], annotations.CheckpointTo, errdefs.ErrFailedPrecondition)
}
