package pagefs

import (
	"errors"
	"testing"
)

// PreSync's passes, each writing back what a scripted guest dirtied
// during the one before.
func TestPreSyncStopsWhenPassesStopShrinking(t *testing.T) {
	errSync := errors.New("fsync failed")
	for _, c := range []struct {
		name    string
		pages   []int // pages each pass writes back
		fail    int   // the pass whose sync fails (from 1), 0: none
		opts    PreSyncOptions
		passes  int
		written int
		err     error
	}{
		{name: "shrinks to settled", pages: []int{64, 32, 16, 8, 4, 2}, opts: PreSyncOptions{Settled: 8 * PageSize}, passes: 4, written: 120},
		{name: "the guest keeps up", pages: []int{64, 60, 30}, opts: PreSyncOptions{Settled: PageSize}, passes: 2, written: 124},
		{name: "bounded", pages: []int{64, 32, 16, 8, 4, 2}, opts: PreSyncOptions{Settled: PageSize, MaxPasses: 3}, passes: 3, written: 112},
		{name: "stopped guest", pages: []int{64, 0}, opts: PreSyncOptions{Settled: PageSize}, passes: 2, written: 64},
		{name: "nothing dirty", pages: []int{0, 0}, passes: 1},
		{name: "default settled", pages: []int{300, 100, 0}, passes: 2, written: 400},
		{name: "sync fails", pages: []int{64, 32, 16}, fail: 2, opts: PreSyncOptions{Settled: PageSize}, passes: 2, written: 96, err: errSync},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, _ := layeredOver(t, 512*PageSize)
			page := make([]byte, PageSize)
			pass := 0
			sync := func() error {
				for pg := range c.pages[pass] {
					if _, err := f.WriteAt(page, int64(pg)*PageSize); err != nil {
						t.Fatal(err)
					}
				}
				pass++
				if pass == c.fail {
					return errSync
				}
				return nil
			}
			st, err := f.PreSync(sync, c.opts)
			if !errors.Is(err, c.err) {
				t.Errorf("err %v, want %v", err, c.err)
			}
			if st.Passes != c.passes || st.Written != int64(c.written)*PageSize || st.Last != int64(c.pages[c.passes-1])*PageSize {
				t.Errorf("%+v, want %d passes, %d pages written, the last %d", st, c.passes, c.written, c.pages[c.passes-1])
			}
		})
	}
}
