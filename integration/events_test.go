//go:build integration

package integration

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
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
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, e.Bin("ctr"), "-a", e.Socket, "events")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	var mu sync.Mutex
	var topics, lines []string
	subscribed := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "/images/create") && strings.Contains(sc.Text(), "events-probe") {
				select {
				case <-subscribed:
				default:
					close(subscribed)
				}
			}
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			f := strings.Fields(sc.Text())
			// "<time> <namespace> <topic> <event>"
			for _, w := range f {
				if strings.HasPrefix(w, "/tasks/") && strings.Contains(sc.Text(), "ev1") {
					mu.Lock()
					topics = append(topics, w)
					mu.Unlock()
				}
			}
		}
	}()
	// `ctr events` is subscribed once it shows an event of our own: tag the
	// image until it prints the tag's /images/create.
	for i := 0; ; i++ {
		tag := fmt.Sprintf("docker.io/cryo/events-probe:%d", i)
		e.MustCtr("image", "tag", harness.Image, tag)
		select {
		case <-subscribed:
		case <-time.After(time.Second):
			if i < 30 {
				continue
			}
			t.Fatal("ctr events showed no /images/create in 30 s")
		}
		break
	}
	e.MustCtr(e.RunArgs("-d", harness.Image, "ev1", "sh", "-c", "trap 'exit 5' TERM; while true; do sleep 0.1; done")...)
	e.MustCtr("task", "exec", "--exec-id", "x1", "ev1", "true")
	e.MustCtr("task", "kill", "-s", "SIGTERM", "ev1")
	waitStopped(t, e, "ev1")
	e.MustCtr("task", "delete", "ev1")
	want := []string{"/tasks/create", "/tasks/start", "/tasks/exec-added", "/tasks/exec-started", "/tasks/exit", "/tasks/exit", "/tasks/delete"}
	var got []string
	harness.WaitFor(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = append([]string(nil), topics...)
		return len(got) >= len(want)
	})
	// containerd adds a /tasks/delete of its own for the exec; keep the
	// first of each kind the contract orders.
	if strings.Join(firstOf(got, len(want)), " ") != strings.Join(want, " ") {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("events = %v, want %v\nctr events:\n%s\ncontainerd log:\n%s", got, want, strings.Join(lines, "\n"), e.LogTail(40))
	}
}

func firstOf(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
