package guest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPty allocates a pty from /dev/ptmx; the slave is opened through the master
// (TIOCGPTPEER), so it does not matter which devpts instance a path would name.
func openPty() (master, slave *os.File, retErr error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer func() {
		if retErr != nil {
			m.Close()
		}
	}()
	rc, err := m.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var sfd int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr != nil {
			return
		}
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
		if errno != 0 {
			ierr = errno
		}
		sfd = int(r)
	}); err != nil {
		return nil, nil, err
	}
	if ierr != nil {
		return nil, nil, fmt.Errorf("open pty slave: %w", ierr)
	}
	return m, os.NewFile(uintptr(sfd), "pty-slave"), nil
}

func resizePty(master *os.File, width, height uint32) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(width), Row: uint16(height)})
	}); err != nil {
		return err
	}
	return ierr
}
