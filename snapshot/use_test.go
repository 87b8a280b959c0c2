package snapshot

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/nodecache"
)

// useTestSnap returns a test snapshot, opened, and an empty cache dir.
func useTestSnap(t *testing.T) (*testSnap, *Snapshot, string) {
	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "v1", WriteOptions{})
	return ts, open(t, store, "v1", ReadOptions{}), t.TempDir()
}

// TestPruneMaterialized: a materialized snapshot stays while a sandbox uses
// it and within the grace period after its last use, and then goes with
// everything beside it; a restore materializes it again.
func TestPruneMaterialized(t *testing.T) {
	ctx := context.Background()
	ts, s, cache := useTestSnap(t)
	d := s.Descriptor.Digest

	release, err := nodecache.OpenSnapshots(cache).Use(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
	if err != nil {
		t.Fatal(err)
	}
	prune := func(grace time.Duration, dry bool) nodecache.PruneStats {
		t.Helper()
		st, err := nodecache.OpenSnapshots(cache).Prune(ctx, grace, dry)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := prune(0, false); st.InUse != 1 || len(st.Removed) != 0 {
		t.Fatalf("in use: %+v", st)
	}
	ts.checkFiles(t, m)
	release()
	if st := prune(time.Hour, false); st.Recent != 1 || len(st.Removed) != 0 {
		t.Fatalf("used a moment ago, grace 1h: %+v", st)
	}
	if st := prune(0, true); len(st.Removed) != 1 || st.FreedBytes <= 0 {
		t.Fatalf("dry run: %+v", st)
	}
	ts.checkFiles(t, m)
	st := prune(0, false)
	if len(st.Removed) != 1 || st.Removed[0] != d.String() || st.FreedBytes <= 0 {
		t.Fatalf("unused: %+v", st)
	}
	t.Logf("freed %d bytes", st.FreedBytes)
	assertEmptyCache(t, cache)

	release, err = nodecache.OpenSnapshots(cache).Use(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if m, err = s.Materialize(ctx, nodecache.OpenSnapshots(cache)); err != nil || m.CacheHit {
		t.Fatalf("materialize after prune: hit %v, %v", m != nil && m.CacheHit, err)
	}
	ts.checkFiles(t, m)
}

// TestUseRacesPrune: a prune running all the time never removes a
// directory between a Use and the end of that use, also when it removes
// the use file between another Use's open and its lock.
func TestUseRacesPrune(t *testing.T) {
	ctx := context.Background()
	_, s, cache := useTestSnap(t)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var removed int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := nodecache.OpenSnapshots(cache).Prune(ctx, 0, false)
			if err != nil {
				t.Error(err)
				return
			}
			removed += len(st.Removed)
		}
	}()
	for i := 0; i < 20; i++ {
		release, err := nodecache.OpenSnapshots(cache).Use(ctx, s.Descriptor.Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Materialize(ctx, nodecache.OpenSnapshots(cache))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if _, err := os.Stat(m.RAM); err != nil {
			t.Fatalf("round %d: the RAM file of a snapshot in use: %v", i, err)
		}
		release()
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if removed == 0 {
		t.Fatal("the prune never removed the unused directory")
	}
	t.Logf("%d removals in 20 rounds", removed)
}

func TestUseRefusesBadDigest(t *testing.T) {
	if _, err := nodecache.OpenSnapshots(t.TempDir()).Use(context.Background(), "sha256:../../etc"); err == nil {
		t.Fatal("Use accepted a bad digest")
	}
	if st, err := nodecache.OpenSnapshots(t.TempDir()+"/none").Prune(context.Background(), 0, false); err != nil || len(st.Removed) != 0 {
		t.Fatalf("prune of a missing dir: %+v, %v", st, errors.Unwrap(err))
	}
}
