package nodecache_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/nodecache"
)

func TestPruneTemp(t *testing.T) {
	cache := t.TempDir()
	for _, d := range []string{".tmp-old", ".tmp-new", "0123"} {
		if err := os.Mkdir(filepath.Join(cache, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(cache, ".tmp-old"), old, old)
	if err := nodecache.OpenSnapshots(cache).PruneTemp(time.Hour); err != nil {
		t.Fatal(err)
	}
	assertEntries(t, cache, ".tmp-new", "0123")
}

// TestSlot: a slot publishes a complete directory once; the next finds it
// complete; a directory without a marker (a crash's, an earlier cryo's) is
// replaced; a prune leaves a used directory and removes an unused one with
// its use file.
func TestSlot(t *testing.T) {
	ctx := context.Background()
	node, err := nodecache.Open(t.TempDir(), nodecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snaps := node.Snapshots()
	d := digest.FromString("manifest")
	materialize := func() (hit bool) {
		t.Helper()
		slot, err := snaps.Lock(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		defer slot.Close()
		if ok, err := slot.Complete(ctx); err != nil || ok {
			return ok
		}
		tmp, err := slot.TempDir()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(tmp, "ram"), []byte("ram"), 0o400)
		if hit, err := slot.Publish(ctx, tmp); err != nil || hit {
			t.Fatalf("publish: hit %v, %v", hit, err)
		}
		return false
	}
	if materialize() {
		t.Fatal("a new snapshot was complete")
	}
	if !materialize() {
		t.Fatal("the published snapshot was not complete")
	}
	os.Remove(filepath.Join(snaps.Path(d), nodecache.CompleteFile))
	if materialize() {
		t.Fatal("a directory without its marker counted as complete")
	}
	assertEntries(t, snaps.Dir(), d.Encoded()) // no lock, no temp left

	release, err := snaps.Use(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := snaps.Prune(ctx, 0, false); err != nil || st.InUse != 1 || len(st.Removed) != 0 {
		t.Fatalf("prune while in use: %+v, %v", st, err)
	}
	release()
	if st, err := snaps.Prune(ctx, 0, false); err != nil || !slices.Equal(st.Removed, []string{d.String()}) {
		t.Fatalf("prune once unused: %+v, %v", st, err)
	}
	assertEntries(t, snaps.Dir())
	if _, err := snaps.Use(ctx, "sha256:../../etc"); err == nil {
		t.Fatal("Use accepted a bad digest")
	}
}

func assertEntries(t *testing.T, dir string, want ...string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s holds %v, want %v", dir, got, want)
	}
}
