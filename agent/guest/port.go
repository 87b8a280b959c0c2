package guest

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Port is the guest end of the agent's virtio-serial port, used with plain
// blocking read and write calls: Go's poller would not do here, because the
// port reports POLLHUP and reads return 0 for as long as no host is connected.
type Port struct{ fd int }

// OpenPort opens the port device.
func OpenPort(path string) (*Port, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open agent port %s: %w", path, err)
	}
	return &Port{fd: fd}, nil
}

// Read returns (0, nil) while no host is connected.
func (p *Port) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(p.fd, b)
		if err == unix.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}

// Write blocks while no host is connected.
func (p *Port) Write(b []byte) (int, error) {
	for {
		n, err := unix.Write(p.fd, b)
		if err == unix.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}

func (p *Port) Close() error { return unix.Close(p.fd) }
