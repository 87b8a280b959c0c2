package shim

import (
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
)

// TestTaskOOM: each time the guest's OOM killer takes processes of a
// started container, the shim publishes containerd's TaskOOM for it, as
// runc's shim does.
func TestTaskOOM(t *testing.T) {
	ts := newTestService(t)
	ts.create(t, "pod", nil)
	g := ts.maker.sb.guest
	g.mu.Lock()
	g.oomKills = make(chan uint64)
	g.mu.Unlock()
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{1, 3} {
		select {
		case g.oomKills <- n:
		case <-time.After(5 * time.Second):
			t.Fatal("the shim does not wait for the container's OOM kills")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ts.pub.mu.Lock()
		var ooms []string
		for _, e := range ts.pub.events {
			if e, ok := e.(*eventstypes.TaskOOM); ok {
				ooms = append(ooms, e.ContainerID)
			}
		}
		ts.pub.mu.Unlock()
		if len(ooms) == 2 && ooms[0] == "pod" && ooms[1] == "pod" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("TaskOOM events %v, want two for pod", ooms)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
