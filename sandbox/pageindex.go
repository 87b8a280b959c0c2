package sandbox

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"

	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// pageIndexFile, in the sandbox state dir, is the page index of the
// sandbox's last checkpoint (hashes and digests, no data): the next
// checkpoint to the same store stores changed chunks as deltas against it.
const pageIndexFile = "pageindex.json"

// usePageIndex makes o read the sandbox's page index, when there is one,
// and save the new one: snapshot.Write ignores an index made for another
// store, chunk size or key, and so writes full chunks after a change.
func usePageIndex(ctx context.Context, sb *Sandbox, to string, o *snapshot.WriteOptions) {
	id, err := storeID(to)
	if err != nil {
		return // stores.Open refuses the URL first
	}
	o.StoreID = id
	o.IndexPath = filepath.Join(sb.spec.StateDir, pageIndexFile)
	x, err := snapshot.LoadPageIndex(o.IndexPath)
	switch {
	case err == nil:
		o.Base = x
	case !errors.Is(err, os.ErrNotExist):
		log.G(ctx).WithError(err).Warn("page index unusable, the checkpoint writes full chunks")
	}
}

// storeID is the store URL without its reference.
func storeID(to string) (string, error) {
	u, err := url.Parse(to)
	if err != nil {
		return "", err
	}
	if u.Path, _, err = stores.SplitRef(u.Path); err != nil {
		return "", err
	}
	u.RawPath = ""
	return u.String(), nil
}
