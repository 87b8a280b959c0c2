package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/internal/sparse"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/sandbox/sharedram"
)

// share is a shared clone's fetch (VMTemplate.SharedClones): the snapshot
// materialized on the node as an eager restore's, and its RAM the node's
// base (nodecache.Bases), which the node's first clone of the snapshot
// fills from the materialized file and every clone maps privately, as
// long as one runs. A snapshot whose RAM travels in its device state has
// no base: it is restored eagerly.
func (st *start) share(ctx context.Context, u *undo) error {
	r := st.restore
	if err := st.materialize(ctx, u); err != nil {
		return err
	}
	if r.rec.RAMInStream || r.mat.RAM == "" {
		log.G(ctx).Info("shared clone: the snapshot's RAM is in its device state; restoring eagerly")
		return nil
	}
	size := int64(r.rec.MemoryMiB) << 20
	base, err := r.node.Bases().Share(ctx, baseScope(st.Tenant, st.src.URL), r.snap.Descriptor.Digest, size, func(f *os.File) error {
		return fillBase(f, r.mat.RAM, size)
	})
	if err != nil {
		return fmt.Errorf("shared clone: base of the snapshot's ram: %w", err)
	}
	ram, err := sharedram.New(base, size, servedram.ParentOf(st.src.URL, r.snap), st.Node.VM.MemoryDir)
	if err != nil {
		base.Close()
		return err
	}
	u.onFailure(func(context.Context) { ram.Close() })
	log.G(ctx).WithFields(log.Fields{"reused": base.Reused(), "digest": r.snap.Descriptor.Digest}).Info("shared clone: the node's base of the snapshot's ram")
	st.mem = &sharedMemory{ram: ram}
	return nil
}

// baseScope is the scope of the bases a tenant's clones share: one store,
// one tenant (a store id of both). Clones of one snapshot share pages only
// within a tenant, so that no tenant learns from page timings which pages
// another's guests touch.
func baseScope(tenant, storeURL string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + nodecache.StoreID(storeURL)))
	return hex.EncodeToString(sum[:16])
}

// fillBase copies a materialized RAM file, which must be size bytes, into
// a new base.
func fillBase(base *os.File, ram string, size int64) error {
	f, err := os.Open(ram)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != size {
		return fmt.Errorf("materialized ram of %d bytes, the snapshot's vm has %d: %w", st.Size(), size, errdefs.ErrDataLoss)
	}
	return sparse.CopyData(base, f, size)
}
