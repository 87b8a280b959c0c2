package sandbox

import "testing"

// TestBesideGuest: a checkpoint of a running guest compresses on the
// cores its vCPUs leave, at least one, and yields to them.
func TestBesideGuest(t *testing.T) {
	for _, c := range []struct{ vcpus, procs, want int }{
		{1, 2, 1}, {2, 2, 1}, {4, 2, 1}, {2, 16, 14},
	} {
		if w, y := besideGuest(c.vcpus, c.procs); w != c.want || !y {
			t.Errorf("besideGuest(%d, %d) = %d, %v; want %d, true", c.vcpus, c.procs, w, y, c.want)
		}
	}
}
