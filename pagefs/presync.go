package pagefs

// PreSyncOptions bound PreSync; zero fields take the defaults.
type PreSyncOptions struct {
	// MaxPasses is the most syncs PreSync makes (default 8).
	MaxPasses int
	// Settled ends the loop when a pass wrote no more bytes than this
	// (default 1 MiB, well under a millisecond of writeback): what is
	// left is not worth a pass.
	Settled int64
}

// PreSyncStats is what a PreSync did.
type PreSyncStats struct {
	Passes  int
	Written int64 // bytes the server received during the passes
	Last    int64 // of which the last pass
}

// PreSync writes a running guest's dirty pages of f back with sync (an
// fsync of the mounted file) pass after pass, so that little is left for
// the fsync in the pause. A pass writes about what the guest dirtied
// during the one before, so the passes shrink as long as the guest writes
// slower than writeback; PreSync stops when a pass wrote no more than
// Settled, or more than three quarters of the pass before (the guest keeps
// up: more passes would not shrink the pause), or after MaxPasses.
//
// A pass is measured by the bytes written to f, not by its dirty set: a
// page the guest rewrites is dirty once but written back at every pass.
// It runs before the pause; the pause itself makes one plain sync.
func (f *File) PreSync(sync func() error, o PreSyncOptions) (PreSyncStats, error) {
	if o.MaxPasses <= 0 {
		o.MaxPasses = 8
	}
	if o.Settled <= 0 {
		o.Settled = 1 << 20
	}
	var st PreSyncStats
	for {
		before := f.writeBytes.Load()
		err := sync()
		prev := st.Last
		st.Passes++
		st.Last = f.writeBytes.Load() - before
		st.Written += st.Last
		if err != nil {
			return st, err
		}
		if st.Last <= o.Settled || (st.Passes > 1 && 4*st.Last > 3*prev) || st.Passes >= o.MaxPasses {
			return st, nil
		}
	}
}
