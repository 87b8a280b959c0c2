package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

type slotClock struct{ t time.Time }

func (c *slotClock) now() time.Time { return c.t }

// cp names a Checkpoint for the slot tests; its UID is namespace/name.
func cp(ns, name string) (types.NamespacedName, types.UID) {
	return types.NamespacedName{Namespace: ns, Name: name}, types.UID(ns + "/" + name)
}

func mustAcquire(t *testing.T, s *nodeSlots, node, ns, name string, want bool) {
	t.Helper()
	key, uid := cp(ns, name)
	got, why := s.acquire(node, key, uid)
	if got != want {
		t.Fatalf("acquire %s/%s on %s = %v (%q), want %v", ns, name, node, got, why, want)
	}
	if !got && !strings.HasPrefix(why, waitingSlot+node) {
		t.Fatalf("acquire %s/%s: why %q, want it to begin %q", ns, name, why, waitingSlot+node)
	}
}

func TestNodeSlotsBound(t *testing.T) {
	c := &slotClock{t: time.Unix(1000, 0)}
	s := newNodeSlots(2, c.now, time.Minute)
	mustAcquire(t, s, "n1", "a", "1", true)
	mustAcquire(t, s, "n1", "a", "2", true)
	mustAcquire(t, s, "n1", "a", "3", false)
	mustAcquire(t, s, "n2", "a", "4", true) // another node's slots
	mustAcquire(t, s, "n1", "a", "1", true) // a holder asking again
	_, uid := cp("a", "1")
	s.calling(uid)
	s.forget(uid) // deleted while its call runs: the node is still busy
	mustAcquire(t, s, "n1", "a", "3", false)
	next, ok := s.done(uid)
	if want, _ := cp("a", "3"); !ok || next != want {
		t.Fatalf("done: next %v %v, want %v", next, ok, want)
	}
	mustAcquire(t, s, "n1", "a", "3", true)
	_, uid2 := cp("a", "2")
	s.forget(uid2) // gave up before calling: its slot is free
	mustAcquire(t, s, "n1", "a", "5", true)
	mustAcquire(t, s, "n1", "a", "6", false)
}

// TestNodeSlotsTakeTurns: a namespace with many waiting Checkpoints
// takes turns with one that came later with one.
func TestNodeSlotsTakeTurns(t *testing.T) {
	c := &slotClock{t: time.Unix(1000, 0)}
	s := newNodeSlots(1, c.now, time.Minute)
	mustAcquire(t, s, "n1", "busy", "0", true)
	for _, name := range []string{"1", "2", "3"} {
		c.t = c.t.Add(time.Second)
		mustAcquire(t, s, "n1", "busy", name, false)
	}
	c.t = c.t.Add(time.Second)
	mustAcquire(t, s, "n1", "quiet", "0", false)

	var order []string
	holder := "busy/0"
	// Every waiter asks again, in an order that must not matter.
	waiting := []string{"busy/3", "busy/2", "quiet/0", "busy/1"}
	for range 4 {
		s.calling(types.UID(holder))
		next, ok := s.done(types.UID(holder))
		if !ok {
			t.Fatalf("done %s: nobody next, want a waiter", holder)
		}
		for i, name := range waiting {
			ns, n, _ := strings.Cut(name, "/")
			key, uid := cp(ns, n)
			if ok, _ := s.acquire("n1", key, uid); ok {
				holder = string(uid)
				waiting = append(waiting[:i:i], waiting[i+1:]...)
				break
			}
		}
		if holder != next.String() {
			t.Fatalf("the slot went to %s, done named %s", holder, next)
		}
		order = append(order, holder)
	}
	if got, want := strings.Join(order, " "), "quiet/0 busy/1 busy/2 busy/3"; got != want {
		t.Fatalf("turns %q, want %q (the quiet namespace first, then the oldest)", got, want)
	}
	if _, ok := s.done(types.UID(holder)); ok {
		t.Fatal("done of the last: a waiter named, want none")
	}
	if len(s.nodes) != 0 || len(s.where) != 0 {
		t.Fatalf("an idle node is still tracked: %d nodes, %d UIDs", len(s.nodes), len(s.where))
	}
}

// TestNodeSlotsStaleWaiter: a waiter that stopped asking (its
// Checkpoint went without a word) does not keep the slot from others.
func TestNodeSlotsStaleWaiter(t *testing.T) {
	c := &slotClock{t: time.Unix(1000, 0)}
	s := newNodeSlots(1, c.now, 10*time.Second)
	mustAcquire(t, s, "n1", "a", "0", true)
	mustAcquire(t, s, "n1", "a", "gone", false)
	c.t = c.t.Add(5 * time.Second)
	mustAcquire(t, s, "n1", "b", "late", false)
	c.t = c.t.Add(6 * time.Second)
	_, uid := cp("a", "0")
	next, ok := s.done(uid)
	if want, _ := cp("b", "late"); !ok || next != want {
		t.Fatalf("done: next %v %v, want %v (a/gone last asked 11 s ago)", next, ok, want)
	}
	mustAcquire(t, s, "n1", "b", "late", true)
}

// TestNodeSlotsWaiterMoves: a waiter whose pod was replaced on another
// node takes a slot there, and its stale place on the first node, pruned
// later, does not keep that slot from being freed when its call ends.
func TestNodeSlotsWaiterMoves(t *testing.T) {
	c := &slotClock{t: time.Unix(1000, 0)}
	s := newNodeSlots(1, c.now, 10*time.Second)
	mustAcquire(t, s, "n1", "a", "0", true)
	mustAcquire(t, s, "n1", "a", "moves", false)
	mustAcquire(t, s, "n2", "a", "moves", true)
	_, uid := cp("a", "moves")
	s.calling(uid)
	c.t = c.t.Add(11 * time.Second)
	mustAcquire(t, s, "n1", "b", "1", false) // prunes n1's stale waiters
	if _, ok := s.done(uid); ok {
		t.Fatal("done on n2 names a waiter; none waits there")
	}
	mustAcquire(t, s, "n2", "b", "2", true)
}

// TestNodeSlotsIdleNodeDropped: a node whose last waiter never asks again
// is forgotten at the next call on any node, not kept for ever.
func TestNodeSlotsIdleNodeDropped(t *testing.T) {
	c := &slotClock{t: time.Unix(1000, 0)}
	s := newNodeSlots(1, c.now, 10*time.Second)
	mustAcquire(t, s, "n1", "a", "0", true)
	mustAcquire(t, s, "n1", "a", "silent", false)
	_, uid := cp("a", "0")
	if _, ok := s.done(uid); !ok {
		t.Fatal("done: no waiter named; a/silent waits")
	}
	c.t = c.t.Add(11 * time.Second)
	mustAcquire(t, s, "n2", "b", "1", true)
	if _, ok := s.nodes["n1"]; ok || len(s.where) != 1 {
		t.Fatalf("nodes %v, where %v: n1 and a/silent kept after it stopped asking", s.nodes, s.where)
	}
}

func TestNodeSlotsUnbounded(t *testing.T) {
	s := newNodeSlots(-1, time.Now, time.Minute)
	for i := range 100 {
		mustAcquire(t, s, "n1", "a", string(rune('a'+i%26))+string(rune('a'+i/26)), true)
	}
}
