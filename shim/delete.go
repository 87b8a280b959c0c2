package shim

import (
	"context"
	"os"
	"time"

	"github.com/containerd/log"
)

// deleteContainer removes a stopped container from the guest and the host;
// the last container takes the VM with it, and needs no tidying inside it.
func (s *service) deleteContainer(ctx context.Context, c *container) {
	sb := s.sb
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
	delete(s.containers, c.id)
	last := len(s.containers) == 0
	s.mu.Unlock()
	s.writeContainerIndex()
	if last {
		s.closeExtension()
		if err := sb.Shutdown(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("shut down sandbox vm")
		}
		_ = os.Remove(statePointerPath(s.bundle))
	} else {
		removeFromGuest(ctx, sb, c)
	}
	if err := os.RemoveAll(c.workDir); err != nil {
		log.G(ctx).WithError(err).Warn("remove container work dir")
	}
}

// guestCleanupTimeout bounds what deleting a container asks of a guest that
// keeps running: its removal and the unplug of its root disk.
const guestCleanupTimeout = 20 * time.Second

func removeFromGuest(ctx context.Context, sb vmSandbox, c *container) {
	select {
	case <-sb.Done():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, guestCleanupTimeout)
	defer cancel()
	if err := sb.Guest().RemoveContainer(ctx, c.guestID); err != nil {
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("remove container in guest")
	}
	if c.hotplugged {
		if err := sb.RemoveRootDisk(ctx, c.disk.ID); err != nil {
			log.G(ctx).WithError(err).WithField("id", c.id).Warn("unplug root disk")
		}
	}
}

func statePointerPath(bundle string) string { return bundle + "/" + statePointerFile }
