package shim

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/sandbox"
)

// restoredPod maps the tasks of a restored sandbox onto the guest
// containers its snapshot holds, by CRI container name: the mapping is the
// shim's business (CRI's names), the containers the sandbox's.
type restoredPod struct {
	rs      *sandbox.Restored
	mu      sync.Mutex
	pending map[string]sandbox.RecordContainer // by guest id
}

func newRestored(rs *sandbox.Restored) *restoredPod {
	r := &restoredPod{rs: rs, pending: map[string]sandbox.RecordContainer{}}
	for _, rc := range rs.Containers {
		r.pending[rc.GuestID] = rc
	}
	return r
}

// claim returns the guest container that a new task takes over: the one
// with the same CRI container name, else the sandbox's own container for
// the sandbox's first task. As KEP-5823's RestorePod matches containers, a
// restored pod's containers are the checkpointed pod's, by name: a CRI
// container whose name the snapshot does not hold is refused, for it would
// run its own program beside the checkpointed one. A name claimed before is
// the kubelet restarting that container, and a finished one an init
// container running again: they start afresh (ok is false).
func (r *restoredPod) claim(specAnnotations map[string]string, first bool) (_ sandbox.RecordContainer, ok bool, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := specAnnotations[annotations.CRIContainerName]
	for id, rc := range r.pending {
		if name != "" && rc.Name == name || first && id == r.rs.SandboxID {
			delete(r.pending, id)
			return rc, true, nil
		}
	}
	if first && len(r.pending) == 1 {
		for id, rc := range r.pending {
			delete(r.pending, id)
			return rc, true, nil
		}
	}
	if name != "" && !slices.Contains(r.names(), name) && !slices.Contains(r.rs.Finished, name) {
		return sandbox.RecordContainer{}, false, fmt.Errorf("restore: container %q is not in the snapshot, whose containers are %s: a restored pod's containers must have the checkpointed pod's names: %w",
			name, r.nameList(), errdefs.ErrInvalidArgument)
	}
	return sandbox.RecordContainer{}, false, nil
}

// unclaimed hands back, once, the guest containers that no task took over.
func (r *restoredPod) unclaimed() []sandbox.RecordContainer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var left []sandbox.RecordContainer
	for id, rc := range r.pending {
		left = append(left, rc)
		delete(r.pending, id)
	}
	slices.SortFunc(left, func(a, b sandbox.RecordContainer) int { return strings.Compare(a.GuestID, b.GuestID) })
	return left
}

// names are the CRI names of the snapshot's containers.
func (r *restoredPod) names() []string {
	var names []string
	for _, rc := range r.rs.Containers {
		if rc.Name != "" {
			names = append(names, rc.Name)
		}
	}
	slices.Sort(names)
	return names
}

func (r *restoredPod) nameList() string {
	names := r.names()
	if len(names) == 0 {
		return "none with a name (it was not made from a pod's container)"
	}
	return fmt.Sprintf("%q", names)
}
