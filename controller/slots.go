package controller

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultNodeCalls is how many kubelet checkpoint calls may run on one
// node at once. A checkpoint reads the guest's RAM, compresses it and
// uploads it: two of them already take most of a small node's spare CPU
// and disk, and the node's tenants share both.
const DefaultNodeCalls = 2

// waitingSlot begins the message of a Checkpoint that waits for a call
// slot on its node.
const waitingSlot = "waiting for a checkpoint slot on node "

// nodeSlots bounds the kubelet calls in flight on each node. A freed slot
// goes to the waiting namespace with the fewest calls on the node, then to
// the one served least recently, then to the oldest waiter: a namespace
// that asks for a hundred checkpoints takes turns with one that asks for
// one, instead of making it wait for its hundred.
//
// The bound is this process's: a predecessor's call that may still run on
// a node (create waits it out) is counted only if it finds a slot free.
type nodeSlots struct {
	limit int // ≤ 0: unbounded
	now   func() time.Time
	// stale is how long a waiter that has not asked again keeps its
	// place: its Checkpoint was deleted, or failed on another step.
	stale time.Duration

	mu    sync.Mutex
	nodes map[string]*nodeQueue
	where map[types.UID]string // a holder's or a waiter's node
}

type nodeQueue struct {
	held    map[types.UID]*hold
	waiting map[types.UID]*waiter
	// served numbers each namespace's last grant on the node.
	served map[string]uint64
	grants uint64
}

type hold struct {
	namespace string
	calling   bool // the call runs: only its end frees the slot
}

type waiter struct {
	key         types.NamespacedName
	since, seen time.Time
}

func newNodeSlots(limit int, now func() time.Time, stale time.Duration) *nodeSlots {
	return &nodeSlots{limit: limit, now: now, stale: stale, nodes: map[string]*nodeQueue{}, where: map[types.UID]string{}}
}

// acquire gives uid a slot on node, or queues it and says why it waits.
// It is idempotent: a holder asking again keeps its slot.
func (s *nodeSlots) acquire(node string, key types.NamespacedName, uid types.UID) (bool, string) {
	if s.limit <= 0 {
		return true, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.pruneStale(now)
	if old, ok := s.where[uid]; ok && old != node {
		// Its pod was replaced on another node: its place there goes.
		s.leave(old, uid)
	}
	q := s.queue(node)
	if _, ok := q.held[uid]; ok {
		return true, ""
	}
	w := q.waiting[uid]
	if w == nil {
		w = &waiter{key: key, since: now}
		q.waiting[uid] = w
		s.where[uid] = node
	}
	w.seen = now
	if len(q.held) < s.limit && s.next(q) == uid {
		delete(q.waiting, uid)
		q.grants++
		q.served[key.Namespace] = q.grants
		q.held[uid] = &hold{namespace: key.Namespace}
		return true, ""
	}
	// The same words each time: a waiter's message is written only when
	// it changes.
	return false, fmt.Sprintf("%s%s (at most %d at once)", waitingSlot, node, s.limit)
}

// calling marks uid's slot as taken by a running call.
func (s *nodeSlots) calling(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.nodes[s.where[uid]]; q != nil && q.held[uid] != nil {
		q.held[uid].calling = true
	}
}

// done frees uid's slot when its call ends, and names the waiter it goes
// to, to be woken (ok false: none waits).
func (s *nodeSlots) done(uid types.UID) (types.NamespacedName, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node := s.where[uid]
	q := s.nodes[node]
	if q == nil {
		return types.NamespacedName{}, false
	}
	delete(q.held, uid)
	delete(s.where, uid)
	s.pruneStale(s.now())
	next, ok := q.waiting[s.next(q)]
	s.dropIfIdle(node, q)
	if !ok {
		return types.NamespacedName{}, false
	}
	return next.key, true
}

// forget drops uid's place in a queue, and its slot unless a call holds
// it: its Checkpoint finished, was deleted or gave up before calling.
func (s *nodeSlots) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if node, ok := s.where[uid]; ok {
		s.leave(node, uid)
	}
}

// leave drops uid's place on node, and its slot unless a call holds it.
func (s *nodeSlots) leave(node string, uid types.UID) {
	q := s.nodes[node]
	if q == nil {
		delete(s.where, uid)
		return
	}
	if h := q.held[uid]; h != nil && h.calling {
		return
	}
	delete(q.held, uid)
	delete(q.waiting, uid)
	delete(s.where, uid)
	s.dropIfIdle(node, q)
}

func (s *nodeSlots) queue(node string) *nodeQueue {
	q := s.nodes[node]
	if q == nil {
		q = &nodeQueue{held: map[types.UID]*hold{}, waiting: map[types.UID]*waiter{}, served: map[string]uint64{}}
		s.nodes[node] = q
	}
	return q
}

// next is the waiter a free slot goes to ("" when none waits).
func (s *nodeSlots) next(q *nodeQueue) types.UID {
	inFlight := map[string]int{}
	for _, h := range q.held {
		inFlight[h.namespace]++
	}
	var best types.UID
	var bw *waiter
	for uid, w := range q.waiting {
		if bw == nil || before(w, uid, bw, best, inFlight, q.served) {
			best, bw = uid, w
		}
	}
	return best
}

// before orders waiters: fewer calls of the namespace in flight, then the
// namespace served longer ago, then the older waiter.
func before(a *waiter, aUID types.UID, b *waiter, bUID types.UID, inFlight map[string]int, served map[string]uint64) bool {
	an, bn := a.key.Namespace, b.key.Namespace
	if inFlight[an] != inFlight[bn] {
		return inFlight[an] < inFlight[bn]
	}
	if served[an] != served[bn] {
		return served[an] < served[bn]
	}
	if !a.since.Equal(b.since) {
		return a.since.Before(b.since)
	}
	return aUID < bUID
}

// pruneStale drops every node's waiters that stopped asking, and the nodes
// left idle: a node whose last waiter never asks again is not touched by
// another call of its own.
func (s *nodeSlots) pruneStale(now time.Time) {
	for node, q := range s.nodes {
		for uid, w := range q.waiting {
			if now.Sub(w.seen) > s.stale {
				delete(q.waiting, uid)
				if s.where[uid] == node {
					delete(s.where, uid)
				}
			}
		}
		s.dropIfIdle(node, q)
	}
}

// dropIfIdle forgets a node nobody holds or waits for (and with it the
// namespaces' turns there: they matter only while some wait).
func (s *nodeSlots) dropIfIdle(node string, q *nodeQueue) {
	if len(q.held) == 0 && len(q.waiting) == 0 {
		delete(s.nodes, node)
	}
}
