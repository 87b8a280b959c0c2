package netdump

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestRetry(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name        string
		interrupted int   // reads interrupted before the answer
		answer      error // the read after them
		want        []int
		wantErr     error
		wantReads   int
	}{
		{"whole at once", 0, nil, []int{1, 2}, nil, 1},
		{"whole on the third read", 2, nil, []int{1, 2}, nil, 3},
		{"another error at once", 0, boom, nil, boom, 1},
		{"interrupted every time", 10, nil, nil, netlink.ErrDumpInterrupted, attempts},
	} {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			got, err := Retry(func() ([]int, error) {
				reads++
				if reads <= c.interrupted {
					return []int{1}, netlink.ErrDumpInterrupted // partial
				}
				if c.answer != nil {
					return nil, c.answer
				}
				return []int{1, 2}, nil
			})
			if !errors.Is(err, c.wantErr) || len(got) != len(c.want) || reads != c.wantReads {
				t.Errorf("Retry = %v, %v after %d reads; want %v, %v after %d", got, err, reads, c.want, c.wantErr, c.wantReads)
			}
		})
	}
}
