// Package qmp is a small client for the QEMU Machine Protocol.
//
// It follows the design of digitalocean/go-qemu's qmp package -- one reader
// goroutine separates asynchronous events from command responses -- and adds
// what that package lacks: every blocking step (greeting, capability
// negotiation, each command) is bounded by a context, and a command can carry a
// file descriptor (SCM_RIGHTS) for `getfd` and `add-fd`.
//
// Each command is sent with a unique "id" that QEMU echoes in its response, so a
// command abandoned on timeout can never be mistaken for the answer to a later
// one.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned for commands issued on, or pending in, a closed client.
var ErrClosed = errors.New("qmp: connection closed")

// Error is an error returned by QEMU for a command.
type Error struct {
	Class string `json:"class"` // e.g. "GenericError", "CommandNotFound", "DeviceNotFound"
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc) }

// Event is an asynchronous QMP event such as SHUTDOWN or DEVICE_DELETED.
type Event struct {
	Name      string
	Data      json.RawMessage // the "data" member, nil when absent
	Timestamp time.Time
}

// Version is QEMU's version as announced in the greeting.
type Version struct {
	Major, Minor, Micro int
	Package             string
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

// message is any line QEMU sends: greeting, response or event.
type message struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major int `json:"major"`
				Minor int `json:"minor"`
				Micro int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
	} `json:"QMP"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	ID     json.RawMessage `json:"id"`
}

type response struct {
	ret json.RawMessage
	err error
}

// Client is a QMP connection. It is safe for concurrent use.
type Client struct {
	conn    *net.UnixConn
	version Version

	writeMu sync.Mutex // serializes writes (a command and its fd are one sendmsg)

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan response
	subs    map[int]chan Event
	nextSub int
	closed  bool
	readErr error

	done chan struct{} // closed when the reader goroutine has ended
}

// Dial connects to the QMP unix socket at path, reads the greeting and
// negotiates capabilities. Every step is bounded by ctx.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	return NewClient(ctx, c.(*net.UnixConn))
}

// NewClient performs the QMP handshake on an established connection: it reads
// the greeting and sends qmp_capabilities, both before ctx is done. The client
// owns conn from now on, also when an error is returned.
func NewClient(ctx context.Context, conn *net.UnixConn) (*Client, error) {
	c := &Client{
		conn:    conn,
		pending: make(map[string]chan response),
		subs:    make(map[int]chan Event),
		done:    make(chan struct{}),
	}
	// The greeting is read synchronously under ctx's deadline; cancelling ctx
	// moves the read deadline into the past, which ends the read at once.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadBytes('\n')
	stop()
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded): // fired just before ctx's own timer
			err = context.DeadlineExceeded
		}
		return nil, fmt.Errorf("qmp: read greeting: %w", err)
	}
	var g message
	if err := json.Unmarshal(line, &g); err != nil || g.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: unexpected greeting %q", truncate(line))
	}
	v := g.QMP.Version
	c.version = Version{Major: v.QEMU.Major, Minor: v.QEMU.Minor, Micro: v.QEMU.Micro, Package: v.Package}

	go c.read(r)
	if _, err := c.Execute(ctx, "qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp: negotiate capabilities: %w", err)
	}
	return c, nil
}

// Version returns the QEMU version from the greeting.
func (c *Client) Version() Version { return c.version }

// Execute runs cmd with args (any JSON-marshalable value; nil for none) and
// returns the raw "return" member. A QEMU error is returned as *Error. If ctx
// ends first, ctx's error is returned and a late response is discarded.
func (c *Client) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return c.execute(ctx, cmd, args, nil)
}

// ExecuteWithFile is Execute with f's descriptor passed alongside the command
// (SCM_RIGHTS), as `getfd` and `add-fd` require. The caller keeps f: QEMU
// receives its own duplicate.
func (c *Client) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	if f == nil {
		return nil, fmt.Errorf("qmp: %s: nil file", cmd)
	}
	return c.execute(ctx, cmd, args, f)
}

func (c *Client) execute(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	c.mu.Lock()
	if c.closed {
		err := c.closedErr()
		c.mu.Unlock()
		return nil, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	ch := make(chan response, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()

	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: encode arguments: %w", cmd, err)
	}
	b = append(b, '\n')
	if err := c.write(ctx, b, f); err != nil {
		// A failed or partial write leaves the stream unusable.
		c.conn.Close()
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = context.DeadlineExceeded
		}
		return nil, fmt.Errorf("qmp: %s: %w: write: %w", cmd, ErrClosed, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			var qe *Error
			if errors.As(r.err, &qe) {
				return nil, r.err // already says "qmp: Class: desc"
			}
			return nil, fmt.Errorf("qmp: %s: %w", cmd, r.err)
		}
		return r.ret, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp: %s: %w", cmd, ctx.Err())
	}
}

// write sends b (with f's descriptor, if any) under the write lock, bounded
// by ctx's deadline.
func (c *Client) write(ctx context.Context, b []byte, f *os.File) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(dl)
		defer c.conn.SetWriteDeadline(time.Time{})
	}
	if f == nil {
		_, err := c.conn.Write(b)
		return err
	}
	n, oobn, err := c.conn.WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil)
	if err != nil {
		return err
	}
	if n != len(b) || oobn == 0 {
		return fmt.Errorf("short write with fd: %d/%d bytes", n, len(b))
	}
	return nil
}

// read is the only reader of the connection. It routes responses to the
// waiting command by id and fans events out to subscribers.
func (c *Client) read(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if err != nil {
			break
		}
		var m message
		if jerr := json.Unmarshal(line, &m); jerr != nil {
			continue // not a QMP message; QEMU never sends these
		}
		switch {
		case m.Event != "":
			c.dispatch(Event{
				Name:      m.Event,
				Data:      m.Data,
				Timestamp: time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000),
			})
		case m.Return != nil || m.Error != nil:
			var id string
			if json.Unmarshal(m.ID, &id) != nil {
				continue // a response without our id: not ours to route
			}
			c.mu.Lock()
			ch := c.pending[id]
			c.mu.Unlock()
			if ch == nil {
				continue // its caller gave up
			}
			r := response{ret: m.Return}
			if m.Error != nil {
				r = response{err: m.Error}
			}
			select { // buffered for one; QEMU answers each id once
			case ch <- r:
			default:
			}
		}
	}
	c.shutdown(err)
}

// dispatch delivers ev to every subscriber without blocking: a subscriber
// whose buffer is full misses the event.
func (c *Client) dispatch(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Subscribe returns a channel that receives every event from now on, and a
// function that ends the subscription. The channel has the given buffer; when
// it is full, events are dropped for this subscriber, so consumers that must
// not miss an event should also poll the state it reports. The channel is
// closed by cancel or when the connection ends.
func (c *Client) Subscribe(buffer int) (<-chan Event, func()) {
	ch := make(chan Event, buffer)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		close(ch)
		return ch, func() {}
	}
	id := c.nextSub
	c.nextSub++
	c.subs[id] = ch
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if s, ok := c.subs[id]; ok {
			delete(c.subs, id)
			close(s)
		}
	}
}

// Done is closed when the connection has ended (QEMU exited or Close).
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the connection. Pending commands fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	var err error
	if !already {
		err = c.conn.Close()
	}
	<-c.done
	return err
}

// shutdown marks the client closed after the reader ended with err and fails
// everything that still waits.
func (c *Client) shutdown(err error) {
	c.mu.Lock()
	c.closed = true
	if c.readErr == nil {
		c.readErr = err
	}
	c.conn.Close()
	for id, ch := range c.pending {
		select { // a response may already be waiting in the buffer
		case ch <- response{err: c.closedErr()}:
		default:
		}
		delete(c.pending, id)
	}
	for id, ch := range c.subs {
		close(ch)
		delete(c.subs, id)
	}
	c.mu.Unlock()
	close(c.done)
}

// closedErr describes why the client is closed. Called with c.mu held.
func (c *Client) closedErr() error {
	if c.readErr != nil && !errors.Is(c.readErr, net.ErrClosed) {
		return fmt.Errorf("%w: %v", ErrClosed, c.readErr)
	}
	return ErrClosed
}

func truncate(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}
