package shim

import (
	"context"
	"sync"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shutdown"
)

// slowPublisher takes a while per event, as a ttrpc call to a busy
// containerd does.
type slowPublisher struct {
	mu     sync.Mutex
	topics []string
	events []events.Event
	closed bool
}

func (p *slowPublisher) Publish(ctx context.Context, topic string, e events.Event) error {
	time.Sleep(20 * time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.topics = append(p.topics, topic)
	p.events = append(p.events, e)
	return nil
}

func (p *slowPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// TestShutdownPublishesQueuedEvents: pkg/shim exits once the shutdown
// callbacks return, so the events queued before shutdown (the last task's
// TaskDelete) must be published by then.
func TestShutdownPublishesQueuedEvents(t *testing.T) {
	ctx, sd := shutdown.WithShutdown(namespaces.WithNamespace(context.Background(), "test"))
	pub := &slowPublisher{}
	svc, err := NewTaskService(ctx, pub, sd)
	if err != nil {
		t.Fatal(err)
	}
	s := svc.(*service)
	for i := 0; i < 5; i++ {
		s.send(&eventstypes.TaskExit{ContainerID: "c"})
	}
	s.send(&eventstypes.TaskDelete{ContainerID: "c"})
	sd.Shutdown()
	select {
	case <-sd.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown did not finish")
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.topics) != 6 || pub.topics[5] != "/tasks/delete" || !pub.closed {
		t.Fatalf("published before the shim could exit: %v (publisher closed: %v)", pub.topics, pub.closed)
	}
}
