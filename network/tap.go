package network

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// openTap creates the tap name inside the netns at nsPath and returns its
// descriptor. Only the TUNSETIFF needs the netns: the calling thread enters
// it and comes back; a thread that cannot come back is never reused (its
// goroutine ends while still locked, and Go retires the thread).
func openTap(nsPath, name string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, back, err := openTapLocked(nsPath, name)
		if back {
			runtime.UnlockOSThread()
		}
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

// openTapLocked runs on a locked thread; back reports whether the thread is
// in its original netns again.
func openTapLocked(nsPath, name string) (_ *os.File, back bool, _ error) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, fmt.Errorf("open own netns: %w", err)
	}
	defer self.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, true, fmt.Errorf("open pod netns: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("enter pod netns %s: %w", nsPath, err)
	}
	f, tapErr := createTap(name)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		if f != nil {
			f.Close()
		}
		return nil, false, fmt.Errorf("return from pod netns: %w", err)
	}
	return f, true, tapErr
}

// createTap creates a non-persistent tap in the current thread's netns.
func createTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, err)
	}
	// Non-blocking, so the returned file supports deadlines (QEMU sets its
	// own copy non-blocking anyway).
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
