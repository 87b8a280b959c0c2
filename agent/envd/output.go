package envd

import (
	"sync"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/process"
)

// outputLimit bounds the output envd holds per process: what its slowest
// subscriber has not read yet, or, while nobody is connected, the most
// recent output, kept for the next one.
const outputLimit = 1 << 20

// output fans a process's output out to its subscribers. It is one log of
// events with a cursor per subscriber:
//   - while someone is connected, the process blocks (through its pipe)
//     once the slowest subscriber is outputLimit behind, as a process
//     writing to a slow terminal does; a subscriber whose client stopped
//     reading is ended by the HTTP write deadline, which unblocks it;
//   - while nobody is connected, the process never blocks: the oldest
//     output is dropped beyond outputLimit, and the next subscriber gets
//     the rest first (commands.connect after a pause and resume sees what
//     was written meanwhile, up to the limit);
//   - a subscriber that joins while others are connected gets the output
//     from then on.
type output struct {
	mu      sync.Mutex
	limit   int
	events  []*rpc.ProcessEvent_DataEvent
	first   uint64 // sequence number of events[0]
	size    int    // bytes in events (payloadSize)
	subs    map[*subscription]struct{}
	closed  bool          // the process ended and all its output is in
	changed chan struct{} // closed and replaced on every change
}

type subscription struct {
	o      *output
	cursor uint64 // sequence number of the next event to read
}

func newOutput(limit int) *output {
	return &output{limit: limit, subs: map[*subscription]struct{}{}, changed: make(chan struct{})}
}

func (o *output) signalLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *output) end() uint64 { return o.first + uint64(len(o.events)) }

// subscribe starts a subscription: at the backlog when nobody else is
// connected, at the end otherwise.
func (o *output) subscribe() *subscription {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := &subscription{o: o, cursor: o.end()}
	if len(o.subs) == 0 {
		s.cursor = o.first
	}
	o.subs[s] = struct{}{}
	return s
}

// put appends ev, waiting while a subscriber is limit behind. After close
// it drops ev: nobody will read it.
func (o *output) put(ev *rpc.ProcessEvent_DataEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.subs) > 0 && o.size >= o.limit && !o.closed {
		ch := o.changed
		o.mu.Unlock()
		<-ch
		o.mu.Lock()
	}
	if o.closed {
		return
	}
	o.events = append(o.events, ev)
	o.size += payloadSize(ev)
	o.trimLocked()
	o.signalLocked()
}

// trimLocked drops what no subscriber will read: the events every
// subscriber is past, or, with none, the oldest beyond the limit.
func (o *output) trimLocked() {
	keepFrom := o.end()
	for s := range o.subs {
		keepFrom = min(keepFrom, s.cursor)
	}
	for len(o.events) > 0 {
		if len(o.subs) > 0 && o.first >= keepFrom {
			break
		}
		if len(o.subs) == 0 && o.size <= o.limit {
			break
		}
		o.size -= payloadSize(o.events[0])
		o.events[0] = nil
		o.events = o.events[1:]
		o.first++
	}
	if len(o.events) == 0 {
		o.events = nil // let the array go
	}
}

// close marks the end of the output.
func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.signalLocked()
}

// next returns the subscriber's next event; with none yet, a channel that
// is closed when there may be one; more is false once the output ended and
// everything was read.
func (s *subscription) next() (ev *rpc.ProcessEvent_DataEvent, wait <-chan struct{}, more bool) {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	s.cursor = max(s.cursor, o.first)
	if s.cursor < o.end() {
		ev = o.events[s.cursor-o.first]
		s.cursor++
		o.trimLocked()
		o.signalLocked() // a writer may wait for room
		return ev, nil, true
	}
	if o.closed {
		return nil, nil, false
	}
	return nil, o.changed, true
}

// cancel ends the subscription; what it did not read stays for the next
// subscriber when it was the last.
func (s *subscription) cancel() {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.subs, s)
	o.trimLocked()
	o.signalLocked()
}

// eventOverhead is what an event costs besides its payload, counted so
// that a process writing a byte at a time cannot make the backlog hold a
// million events.
const eventOverhead = 64

func payloadSize(ev *rpc.ProcessEvent_DataEvent) int {
	return eventOverhead + len(ev.GetStdout()) + len(ev.GetStderr()) + len(ev.GetPty())
}
