//go:build integration

package vmm

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newTap opens a tap device in a new, private network namespace (never the
// host's) and returns its fd. Closing the file removes the tap and the
// namespace.
func newTap(t *testing.T) *os.File {
	t.Helper()
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread enters a new netns and is discarded when this goroutine
		// ends without unlocking it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: err}
			return
		}
		f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		ifr, _ := unix.NewIfreq("tap0")
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETIFF, ifr); err != nil {
			f.Close()
			ch <- result{err: err}
			return
		}
		ch <- result{f: f}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("create tap (needs root and /dev/net/tun): %v", r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	return r.f
}

func TestNICFromTapFD(t *testing.T) {
	cfg := testConfig(t, "nic")
	cfg.NICs = []NIC{{ID: "eth0", Tap: newTap(t), MAC: "52:54:00:c7:10:01"}}
	m := startVM(t, cfg)
	waitConsole(t, m, "cryo-test-ready", 60*time.Second)
	a := dialAgent(t, m)
	waitGuest(t, a, "cat /sys/class/net/*/address", func(s string) bool { return strings.Contains(s, "52:54:00:c7:10:01") })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pci []struct {
		Devices []struct {
			Slot   int    `json:"slot"`
			QdevID string `json:"qdev_id"`
		} `json:"devices"`
	}
	if err := m.execute(ctx, "query-pci", nil, &pci); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range pci[0].Devices {
		found = found || (d.QdevID == "eth0" && d.Slot == slotFirstNIC)
	}
	if !found {
		t.Errorf("eth0 not at slot %#x: %+v", slotFirstNIC, pci)
	}
}
