// Package session frames host connections to the guest agent into epochs.
//
// The agent's transport is a virtio-serial port: one byte stream that outlives
// every host connection. A new host (a reconnecting shim, or a brand-new QEMU after
// a restore) must never see bytes meant for the previous one, and the guest's ttrpc
// server must start over (ttrpc refuses stream ids that do not increase). The guest
// notices a host disconnect as EOF on the port, but a quick close+open can reach
// the guest as one event, and after a restore the port may never look closed. So
// every host connection starts with a hello carrying a random nonce, and the guest
// answers with an ack echoing it:
//
//	hello (host->guest): ff ff ff ff 'C' 'R' 'Y' 'O' nonce[8]
//	ack   (guest->host): ff ff ff ff 'C' 'R' 'Y' 'A' nonce[8]
//
// A ttrpc frame starts with a 4-byte big-endian length of at most 4 MiB, so the
// guest can tell a hello from a frame at every frame boundary. On a hello (or EOF)
// the guest ends the current epoch (its ttrpc connection sees EOF) and starts a new
// one. The host discards everything before its own ack: stale replies of the
// previous epoch that were still in flight.
package session

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

const (
	markerLen = 8
	helloLen  = markerLen + 8
	// frameHeaderLen is the size of a ttrpc message header (length, stream id,
	// type, flags).
	frameHeaderLen = 10
	// maxFrameLen is ttrpc's message size limit plus slack.
	maxFrameLen = 4<<20 + 1024
)

var (
	helloMarker = [markerLen]byte{0xff, 0xff, 0xff, 0xff, 'C', 'R', 'Y', 'O'}
	ackMarker   = [markerLen]byte{0xff, 0xff, 0xff, 0xff, 'C', 'R', 'Y', 'A'}
)

type nonce [8]byte

func message(marker [markerLen]byte, n nonce) []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, marker[:]...)
	return append(b, n[:]...)
}

// scan reads from r until marker followed by a nonce; when want is not nil, only
// that nonce ends the scan. Everything before is discarded.
func scan(r *bufio.Reader, marker [markerLen]byte, want *nonce) (nonce, error) {
	var window [helloLen]byte
	filled := 0
	for {
		c, err := r.ReadByte()
		if err != nil {
			return nonce{}, err
		}
		if filled < helloLen {
			window[filled] = c
			filled++
		} else {
			copy(window[:], window[1:])
			window[helloLen-1] = c
		}
		if filled < helloLen || !bytes.Equal(window[:markerLen], marker[:]) {
			continue
		}
		var n nonce
		copy(n[:], window[markerLen:])
		if want == nil || n == *want {
			return n, nil
		}
	}
}

// hostConn is the host end of a session: it sends the hello on creation and hides
// everything the guest sent before the matching ack.
type hostConn struct {
	net.Conn
	n        nonce
	helloErr error
	r        *bufio.Reader
	synced   bool
}

// NewHostConn starts a new epoch on conn (the host's connection to the agent
// port) and returns the connection to run ttrpc on.
func NewHostConn(conn net.Conn) net.Conn {
	c := &hostConn{Conn: conn, r: bufio.NewReader(conn)}
	if _, err := rand.Read(c.n[:]); err != nil {
		c.helloErr = fmt.Errorf("session nonce: %w", err)
		return c
	}
	if _, err := conn.Write(message(helloMarker, c.n)); err != nil {
		c.helloErr = fmt.Errorf("send session hello: %w", err)
	}
	return c
}

func (c *hostConn) Read(b []byte) (int, error) {
	if !c.synced {
		if _, err := scan(c.r, ackMarker, &c.n); err != nil {
			return 0, err
		}
		c.synced = true
	}
	return c.r.Read(b)
}

func (c *hostConn) Write(b []byte) (int, error) {
	if c.helloErr != nil {
		return 0, c.helloErr
	}
	return c.Conn.Write(b)
}

var errClosed = errors.New("session epoch closed")

// epochConn is the guest end of one host connection: reads come from the
// listener's reader through a pipe, writes go to the port unless the epoch ended.
type epochConn struct {
	l    *Listener
	pr   *io.PipeReader
	pw   *io.PipeWriter
	mu   sync.Mutex // guards dead
	dead bool
}

func (e *epochConn) Read(b []byte) (int, error) { return e.pr.Read(b) }

func (e *epochConn) Write(b []byte) (int, error) { return e.l.write(e, b) }

func (e *epochConn) isDead() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dead
}

// end stops the epoch: no more writes reach the port, reads see EOF.
func (e *epochConn) end() {
	e.mu.Lock()
	e.dead = true
	e.mu.Unlock()
	e.pw.CloseWithError(io.EOF)
}

func (e *epochConn) Close() error {
	e.end()
	e.pr.CloseWithError(net.ErrClosed)
	return nil
}

func (e *epochConn) LocalAddr() net.Addr  { return portAddr{} }
func (e *epochConn) RemoteAddr() net.Addr { return portAddr{} }

// Deadlines are not supported on the port; ttrpc does not use them.
func (e *epochConn) SetDeadline(time.Time) error      { return nil }
func (e *epochConn) SetReadDeadline(time.Time) error  { return nil }
func (e *epochConn) SetWriteDeadline(time.Time) error { return nil }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return "agent port" }
