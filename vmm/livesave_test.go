package vmm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/vmm/qmp"
	"github.com/cryo-runtime/cryo/vmm/qmp/qmptest"
)

// liveServer fakes a live save: the migration is active until
// switchoverAfter queries, then pauses before its switchover (or until the
// downtime limit is raised, when converge is set), and completes after
// migrate-continue.
type liveServer struct {
	mu              sync.Mutex
	switchoverAfter int // queries; 0: only once the downtime limit is raised
	queries         int
	raised          bool
	continued       bool
	failAt          string // a status to report instead of pre-switchover
}

func (l *liveServer) handle(r qmptest.Request) (any, *qmp.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch r.Execute {
	case "migrate-set-parameters":
		if strings.Contains(string(r.Arguments), `"downtime-limit":2000000`) {
			l.raised = true
		}
	case "migrate-continue":
		l.continued = true
	case "query-migrate":
		l.queries++
		switch {
		case l.continued:
			return map[string]any{"status": "completed"}, nil
		case l.switchoverAfter > 0 && l.queries >= l.switchoverAfter, l.switchoverAfter == 0 && l.raised:
			if l.failAt != "" {
				return map[string]any{"status": l.failAt, "error-desc": "boom"}, nil
			}
			return map[string]any{"status": "pre-switchover"}, nil
		}
		return map[string]any{"status": "active"}, nil
	}
	return nil, nil
}

func liveFile(t *testing.T) *os.File {
	t.Helper()
	w, err := os.Create(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestSaveStateLiveSequence: under KVM the guest is not stopped by the
// caller; the capabilities ask for a pause before the switchover, Stopped
// runs there, once, with QEMU's STOP time, and the save continues to
// completion.
func TestSaveStateLiveSequence(t *testing.T) {
	l := &liveServer{switchoverAfter: 3}
	cfg := unitConfig(t)
	cfg.Accel = "kvm"
	m, srv := fakeMachine(t, cfg, l.handle)
	var stops []time.Time
	err := m.SaveStateLive(context.Background(), liveFile(t), LiveSave{Converge: time.Minute, Stopped: func(_ context.Context, stop time.Time) error {
		stops = append(stops, stop)
		if slices.Contains(srv.Commands(), "migrate-continue") {
			t.Error("Stopped ran after migrate-continue")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	cmds := srv.Commands()
	if slices.Contains(cmds, "stop") || slices.Contains(cmds, "migrate_cancel") {
		t.Errorf("commands = %v: the guest runs until QEMU stops it, and nothing is cancelled", cmds)
	}
	if len(stops) != 1 || stops[0].IsZero() {
		t.Fatalf("Stopped ran %d times: %v", len(stops), stops)
	}
	reqs := srv.Requests()
	if s := string(reqs[0].Arguments); !strings.Contains(s, `"capability":"pause-before-switchover","state":true`) ||
		!strings.Contains(s, `"capability":"x-ignore-shared","state":true`) {
		t.Errorf("capabilities = %s", s)
	}
}

// TestSaveStateLiveStopsFirstUnderTCG: under TCG the VM stops right
// before the migration starts (QEMU 7.2's TCG dirty tracking loses
// writes), and Stopped gets the time of that stop.
func TestSaveStateLiveStopsFirstUnderTCG(t *testing.T) {
	l := &liveServer{switchoverAfter: 3}
	cfg := unitConfig(t)
	cfg.Accel = "tcg"
	m, srv := fakeMachine(t, cfg, l.handle)
	before := time.Now()
	var stop time.Time
	err := m.SaveStateLive(context.Background(), liveFile(t), LiveSave{Converge: time.Minute, Stopped: func(_ context.Context, s time.Time) error {
		stop = s
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	cmds := srv.Commands()
	i := slices.Index(cmds, "stop")
	if i < 0 || i+1 >= len(cmds) || cmds[i+1] != "migrate" {
		t.Errorf("commands = %v: want stop right before migrate", cmds)
	}
	if stop.Before(before) || stop.After(time.Now()) {
		t.Errorf("Stopped got %v, want the stop's time (after %v)", stop, before)
	}
}

// TestSaveStateLiveConverges: a guest that never converges by itself is
// stopped once Converge has passed (the downtime limit raised).
func TestSaveStateLiveConverges(t *testing.T) {
	l := &liveServer{}
	m, _ := fakeMachine(t, unitConfig(t), l.handle)
	start := time.Now()
	err := m.SaveStateLive(context.Background(), liveFile(t), LiveSave{Converge: 100 * time.Millisecond,
		Stopped: func(context.Context, time.Time) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("save took %v with a 100 ms converge", d)
	}
	if !l.raised {
		t.Error("the downtime limit was not raised")
	}
}

// TestSaveStateLiveFailures: a migration that fails before its
// switchover, or a Stopped that fails, cancels the save with the reason.
func TestSaveStateLiveFailures(t *testing.T) {
	for _, c := range []struct {
		name    string
		l       *liveServer
		stopped error
		want    string
	}{
		{"migration failed", &liveServer{switchoverAfter: 2, failAt: "failed"}, nil, "boom"},
		{"freeze failed", &liveServer{switchoverAfter: 2}, errors.New("freeze disk rootfs: no space"), "no space"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, srv := fakeMachine(t, unitConfig(t), c.l.handle)
			err := m.SaveStateLive(context.Background(), liveFile(t), LiveSave{Converge: time.Minute,
				Stopped: func(context.Context, time.Time) error { return c.stopped }})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			if !slices.Contains(srv.Commands(), "migrate_cancel") {
				t.Errorf("no migrate_cancel: %v", srv.Commands())
			}
			if slices.Contains(srv.Commands(), "migrate-continue") {
				t.Errorf("continued after a failure: %v", srv.Commands())
			}
		})
	}
}

// TestSaveStatePlainAfterLive: a plain save turns the pause before the
// switchover off again.
func TestSaveStatePlainAfterLive(t *testing.T) {
	m, srv := fakeMachine(t, unitConfig(t), migrationServer("DEVSTATE", map[string]any{"status": "completed"}))
	if err := m.SaveState(context.Background(), liveFile(t)); err != nil {
		t.Fatal(err)
	}
	if s := string(srv.Requests()[1].Arguments); !strings.Contains(s, `"capability":"pause-before-switchover","state":false`) {
		t.Errorf("capabilities = %s", s)
	}
}
