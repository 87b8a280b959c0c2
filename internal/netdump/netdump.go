// Package netdump retries the netlink dumps that the kernel interrupted.
//
// A dump (a list of links, addresses or routes) that the kernel marks
// NLM_F_DUMP_INTR changed while it was read: vishvananda/netlink returns
// ErrDumpInterrupted with what may be a partial list. A guest's NIC does
// that right after it takes its pod's MAC and comes up, while IPv6
// configures it. Read again, the list is whole. (containernetworking's
// netlinksafe does the same, but logs through the standard logger and, after
// its last attempt, returns the partial list as if whole.)
package netdump

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// attempts bounds how often one dump is read: a list that keeps changing
// is an error, not a loop.
const attempts = 5

// Retry returns dump's result once the kernel did not interrupt it, reading
// it at most attempts times; a dump interrupted every time returns its
// netlink.ErrDumpInterrupted.
func Retry[T any](dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range attempts {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	var zero T
	return zero, err
}
