package e2bapi

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// uncachedEvery is how often a wait asks the API server about an object
// that Server.Cache does not hold, and has not held: one it has just
// created, which the informer shows a few milliseconds later, or one the
// cache never holds (a pod whose owner removed controller.LabelRuntimeClass).
// Only then does waiting cost the API server anything, a read per period
// instead of one per poll().
const uncachedEvery = 2 * time.Second

// errNotCached: the cache does not hold the object (yet), and it is too
// soon to ask the API server. Not a deletion.
var errNotCached = errors.New("not in the cache yet")

// watched is the one object a wait loop reads every poll(): from
// Server.Cache when it is set, so that a caller waiting costs the shared
// API server nothing, else (tests) from Client.
//
// The cache's NotFound does not mean deleted: an object just created
// reaches it only when the informer's event does. Only the API server's
// NotFound does, so a miss is confirmed there: at once when the cache
// held the object before (it is gone, or its event lags) or when it is
// known to be cached (confirm), otherwise no sooner than uncachedEvery
// after the last confirmation. A wait therefore fails on a deletion only
// after one read that the API server answers, and a pod the cache never
// holds is still seen to run, at a read every uncachedEvery.
type watched struct {
	s   *Server
	key client.ObjectKey
	// uid is the object waited for, when known: the cache's copy of an
	// older object of that name (deleted, its event not in yet) is not it.
	uid     types.UID
	confirm bool
	next    time.Time
}

// watch is a wait's reader of key; known: the cache holds it already if
// it ever will (it was there long before the wait), so a miss is asked
// about at once.
func (s *Server) watch(key client.ObjectKey, uid types.UID, known bool) *watched {
	return &watched{s: s, key: key, uid: uid, confirm: known, next: time.Now().Add(uncachedEvery)}
}

// read is the object's newest state that w may read now: the cache's, or
// the API server's (whose NotFound means deleted), or errNotCached.
func read[T any, P interface {
	*T
	client.Object
}](ctx context.Context, w *watched) (P, error) {
	if w.s.Cache != nil {
		obj := P(new(T))
		err := w.s.Cache.Get(ctx, w.key, obj)
		switch {
		case err == nil && (w.uid == "" || obj.GetUID() == w.uid):
			w.confirm = true
			return obj, nil
		case err != nil && !apierrors.IsNotFound(err):
			return nil, err
		case !w.confirm && time.Now().Before(w.next):
			return nil, errNotCached
		}
		w.confirm, w.next = false, time.Now().Add(uncachedEvery)
	}
	obj := P(new(T))
	if err := w.s.Client.Get(ctx, w.key, obj); err != nil {
		return nil, err
	}
	return obj, nil
}
