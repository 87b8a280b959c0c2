//go:build integration

package integration

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestEventOrder: the shim publishes task events in the order of the
// runtime-v2 contract: create, start, exec-added, exec-started, the exec's
// exit, the init's exit, delete.
func TestEventOrder(t *testing.T) {
	e := harness.Start(t)
	events := watchEvents(t, e)
	e.MustCtr(e.RunArgs("-d", harness.Image, "ev1", "sh", "-c", "trap 'exit 5' TERM; while true; do sleep 0.1; done")...)
	e.MustCtr("task", "exec", "--exec-id", "x1", "ev1", "true")
	e.MustCtr("task", "kill", "-s", "SIGTERM", "ev1")
	waitStopped(t, e, "ev1")
	e.MustCtr("task", "delete", "ev1")
	want := []string{"/tasks/create", "/tasks/start", "/tasks/exec-added", "/tasks/exec-started", "/tasks/exit", "/tasks/exit", "/tasks/delete"}
	var got []string
	harness.WaitFor(10*time.Second, func() bool {
		got = taskTopics(events.all(), "ev1")
		return len(got) >= len(want)
	})
	// containerd adds a /tasks/delete of its own for the exec; keep the
	// first of each kind the contract orders.
	if strings.Join(firstOf(got, len(want)), " ") != strings.Join(want, " ") {
		t.Fatalf("events = %v, want %v\nctr events:\n%s\ncontainerd log:\n%s", got, want, strings.Join(events.all(), "\n"), e.LogTail(40))
	}
}

// taskTopics are the /tasks/ topics of the lines ("<time> <namespace>
// <topic> <event>") that name container id.
func taskTopics(lines []string, id string) []string {
	var topics []string
	for _, l := range lines {
		if !strings.Contains(l, id) {
			continue
		}
		for _, w := range strings.Fields(l) {
			if strings.HasPrefix(w, "/tasks/") {
				topics = append(topics, w)
			}
		}
	}
	return topics
}

func firstOf(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// eventLog is `ctr events` of an Env, subscribed.
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// watchEvents runs `ctr events` until the test ends and returns once it is
// subscribed: it has shown an image tag of the test's own.
func watchEvents(t *testing.T, e *harness.Env) *eventLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, e.Bin("ctr"), "-a", e.Socket, "events")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	l := &eventLog{}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.mu.Unlock()
		}
	}()
	for i := 0; i < 30; i++ {
		tag := fmt.Sprintf("docker.io/cryo/events-probe:%d", i)
		e.MustCtr("image", "tag", harness.Image, tag)
		if harness.WaitFor(time.Second, func() bool {
			for _, s := range l.all() {
				if strings.Contains(s, "/images/create") && strings.Contains(s, tag) {
					return true
				}
			}
			return false
		}) {
			return l
		}
	}
	t.Fatal("ctr events showed no /images/create in 30 s")
	return nil
}

// TestTaskOOMEvent: a process of a memory-limited container that the
// guest's OOM killer takes is published as /tasks/oom for the container,
// as runc's shim does, while its main process runs on.
func TestTaskOOMEvent(t *testing.T) {
	e := harness.Start(t)
	events := watchEvents(t, e)
	e.MustCtr(e.RunArgs("-d", "--memory-limit", strconv.Itoa(32<<20), harness.Image, "oom1",
		"sh", "-c", "dd if=/dev/zero of=/dev/null bs=96M count=1; echo survived; sleep inf")...)
	if !harness.WaitFor(90*time.Second, func() bool { return slices.Contains(taskTopics(events.all(), "oom1"), "/tasks/oom") }) {
		t.Fatalf("no /tasks/oom for oom1 in 90 s\nctr events:\n%s\ncontainerd log:\n%s", strings.Join(events.all(), "\n"), e.LogTail(40))
	}
	if out, _, _ := e.Ctr("task", "ls"); !strings.Contains(out, "oom1") || !strings.Contains(out, "RUNNING") {
		t.Errorf("after the OOM kill of its dd: %s, want oom1 running", out)
	}
	e.MustCtr("task", "kill", "-s", "SIGKILL", "oom1")
	waitStopped(t, e, "oom1")
	e.MustCtr("task", "delete", "oom1")
	e.MustCtr("c", "rm", "oom1")
}
