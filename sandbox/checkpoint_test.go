package sandbox

import "testing"

// TestBesideGuest: a checkpoint of a running guest compresses on the
// cores its vCPUs leave, at least one.
func TestBesideGuest(t *testing.T) {
	for _, c := range []struct{ vcpus, procs, want int }{
		{1, 2, 1}, {2, 2, 1}, {4, 2, 1}, {2, 16, 14},
	} {
		if w := besideGuest(c.vcpus, c.procs); w != c.want {
			t.Errorf("besideGuest(%d, %d) = %d, want %d", c.vcpus, c.procs, w, c.want)
		}
	}
}
