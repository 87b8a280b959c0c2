package snapshot

import "bytes"

var zeroPage [PageSize]byte

// writeSparse writes b at off through write, leaving out the all-zero
// pages: Materialize creates every file sparse (truncated to its size), so
// they read back as zeros without being written. A guest's RAM chunks are
// often half zero pages; not writing them saves the copy into the page
// cache and the memory it would hold (a clone maps them as the shared
// zero page). Runs of data pages are written with one call each.
func writeSparse(write func(f writerAt, b []byte, off int64) (int, error), f writerAt, b []byte, off int64) error {
	start := -1 // first byte of the current run of data pages
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		_, err := write(f, b[start:end], off+int64(start))
		start = -1
		return err
	}
	for p := 0; p < len(b); p += PageSize {
		end := min(p+PageSize, len(b))
		if bytes.Equal(b[p:end], zeroPage[:end-p]) {
			if err := flush(p); err != nil {
				return err
			}
		} else if start < 0 {
			start = p
		}
	}
	return flush(len(b))
}
