package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/vmm/qmp"
	"github.com/cryo-runtime/cryo/vmm/qmp/qmptest"
)

// fakeMachine returns a machine whose QMP monitor is a fake server.
func fakeMachine(t *testing.T, cfg Config, h qmptest.Handler) (*Machine, *qmptest.Server) {
	t.Helper()
	m := mustNew(t, cfg)
	c, s := qmptest.NewClient(t, h)
	m.started, m.running, m.mon = true, true, c
	return m, s
}

func args(t *testing.T, r qmptest.Request) map[string]any {
	t.Helper()
	var a map[string]any
	if len(r.Arguments) > 0 {
		if err := json.Unmarshal(r.Arguments, &a); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// migrationServer fakes an outgoing or incoming migration: getfd keeps the
// file, migrate writes payload to it, query-migrate reports statuses in turn
// (the last one repeats).
func migrationServer(payload string, statuses ...map[string]any) qmptest.Handler {
	var mu sync.Mutex
	var f *os.File
	n := 0
	return func(r qmptest.Request) (any, *qmp.Error) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Execute {
		case "getfd":
			if len(r.Files) != 1 {
				return nil, &qmp.Error{Class: "GenericError", Desc: "No file descriptor supplied via SCM_RIGHTS"}
			}
			f = r.Files[0]
		case "migrate", "migrate-incoming":
			if f != nil {
				f.WriteString(payload)
				f.Close()
			}
		case "query-migrate":
			st := statuses[min(n, len(statuses)-1)]
			n++
			return st, nil
		}
		return nil, nil
	}
}

func TestSaveStateSequence(t *testing.T) {
	m, srv := fakeMachine(t, unitConfig(t), migrationServer("DEVSTATE",
		map[string]any{"status": "active"}, map[string]any{"status": "completed"}))
	out := filepath.Join(t.TempDir(), "state")
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := m.SaveState(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	want := []string{"stop", "migrate-set-capabilities", "migrate-set-parameters", "getfd", "migrate", "query-migrate", "query-migrate"}
	if got := srv.Commands(); !slices.Equal(got, want) {
		t.Errorf("commands = %v, want %v", got, want)
	}
	reqs := srv.Requests()
	if s := string(reqs[1].Arguments); !strings.Contains(s, `"capability":"x-ignore-shared","state":true`) {
		t.Errorf("capabilities = %s", s)
	}
	if a := args(t, reqs[4]); a["uri"] != "fd:"+args(t, reqs[3])["fdname"].(string) {
		t.Errorf("migrate uri %v does not name the passed fd %v", a["uri"], args(t, reqs[3]))
	}
	if b, _ := os.ReadFile(out); string(b) != "DEVSTATE" {
		t.Errorf("state file = %q", b)
	}
}

func TestSaveStateFailureCancels(t *testing.T) {
	m, srv := fakeMachine(t, unitConfig(t), migrationServer("",
		map[string]any{"status": "failed", "error-desc": "Unable to write to file: No space left on device"}))
	w, _ := os.Create(filepath.Join(t.TempDir(), "state"))
	defer w.Close()
	err := m.SaveState(context.Background(), w)
	if err == nil || !strings.Contains(err.Error(), "No space left on device") || !strings.HasPrefix(err.Error(), "save vm sb1: ") {
		t.Fatalf("err = %v", err)
	}
	if !slices.Contains(srv.Commands(), "migrate_cancel") {
		t.Errorf("no migrate_cancel after a failure: %v", srv.Commands())
	}
}

func TestSaveStateTimeout(t *testing.T) {
	m, srv := fakeMachine(t, unitConfig(t), migrationServer("", map[string]any{"status": "active"}))
	w, _ := os.Create(filepath.Join(t.TempDir(), "state"))
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.SaveState(ctx, w)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
	if !slices.Contains(srv.Commands(), "migrate_cancel") {
		t.Errorf("no migrate_cancel after a timeout: %v", srv.Commands())
	}
}

// TestSaveStateInPause: a save inside a pause spends no round trip it can
// skip: no second stop after Pause, and the capabilities and parameters
// only when they changed (a live save between sets them again, and so does
// a plain save after it).
func TestSaveStateInPause(t *testing.T) {
	l := &liveServer{switchoverAfter: 1}
	h := migrationServer("DEVSTATE", map[string]any{"status": "completed"})
	cfg := unitConfig(t)
	cfg.Accel = "kvm"
	var live atomic.Bool
	m, srv := fakeMachine(t, cfg, func(r qmptest.Request) (any, *qmp.Error) {
		if live.Load() && (r.Execute == "query-migrate" || r.Execute == "migrate-continue") {
			return l.handle(r)
		}
		return h(r)
	})
	ctx := context.Background()
	var got [][]string
	save := func(isLive bool) {
		t.Helper()
		n := len(srv.Commands())
		if err := m.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		live.Store(isLive)
		if isLive {
			if err := m.SaveStateLive(ctx, liveFile(t), LiveSave{Converge: time.Minute, Stopped: func(context.Context, time.Time) error { return nil }}); err != nil {
				t.Fatal(err)
			}
		} else if err := m.SaveState(ctx, liveFile(t)); err != nil {
			t.Fatal(err)
		}
		if err := m.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		got = append(got, srv.Commands()[n:])
	}
	save(false)
	save(false)
	save(true)
	save(false)
	save(false)
	want := [][]string{
		{"stop", "migrate-set-capabilities", "migrate-set-parameters", "getfd", "migrate", "query-migrate", "cont"},
		{"stop", "getfd", "migrate", "query-migrate", "cont"},
		{"stop", "migrate-set-capabilities", "migrate-set-parameters", "getfd", "migrate", "query-migrate", "migrate-continue", "query-migrate", "cont"},
		{"stop", "migrate-set-capabilities", "migrate-set-parameters", "getfd", "migrate", "query-migrate", "cont"},
		{"stop", "getfd", "migrate", "query-migrate", "cont"},
	}
	for i := range want {
		if i >= len(got) || !slices.Equal(got[i], want[i]) {
			t.Errorf("save %d: commands %v, want %v", i+1, got[min(i, len(got)-1)], want[i])
		}
	}
}

// TestSaveStateEndsOnEvent: the save ends on QEMU's MIGRATION event,
// without waiting for a query to see it: here no query ever does.
func TestSaveStateEndsOnEvent(t *testing.T) {
	var srv *qmptest.Server
	h := migrationServer("DEVSTATE", map[string]any{"status": "active"})
	m, s := fakeMachine(t, unitConfig(t), func(r qmptest.Request) (any, *qmp.Error) {
		if r.Execute == "migrate" {
			go func() {
				time.Sleep(20 * time.Millisecond)
				srv.Event("MIGRATION", map[string]any{"status": "completed"})
			}()
		}
		return h(r)
	})
	srv = s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := m.SaveState(ctx, liveFile(t)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the save took %v", d)
	}
	if s := string(srv.Requests()[0].Arguments); srv.Requests()[0].Execute != "stop" {
		t.Errorf("first command %s %s, want stop", srv.Requests()[0].Execute, s)
	}
	if a := string(srv.Requests()[1].Arguments); !strings.Contains(a, `"capability":"events","state":true`) {
		t.Errorf("capabilities = %s: the events that end the wait are off", a)
	}
}

func TestLoadState(t *testing.T) {
	cfg := unitConfig(t)
	m, _ := fakeMachine(t, cfg, migrationServer("", map[string]any{"status": "completed"}))
	r, _ := os.Open(os.DevNull)
	defer r.Close()
	if err := m.LoadState(context.Background(), r); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("LoadState of a booted machine: %v", err)
	}
	cfg.Memory.Mode = MemoryServed // booted on a page server's file
	m, _ = fakeMachine(t, cfg, migrationServer("", map[string]any{"status": "completed"}))
	if err := m.LoadState(context.Background(), r); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("LoadState of a booted machine with served memory: %v", err)
	}
	cfg.Memory.Mode, cfg.Memory.Incoming = MemoryPrivate, true
	m, srv := fakeMachine(t, cfg, migrationServer("", map[string]any{"status": "active"}, map[string]any{"status": "completed"}))
	if err := m.LoadState(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	want := []string{"migrate-set-capabilities", "getfd", "migrate-incoming", "query-migrate", "query-migrate"}
	if got := srv.Commands(); !slices.Equal(got, want) {
		t.Errorf("commands = %v, want %v", got, want)
	}
}

func TestHotplugRollsBackAndReusesPorts(t *testing.T) {
	cfg := unitConfig(t)
	cfg.Disks, cfg.HotplugPorts = nil, 2
	failNext := true
	m, srv := fakeMachine(t, cfg, func(r qmptest.Request) (any, *qmp.Error) {
		if r.Execute == "device_add" && failNext {
			failNext = false
			return nil, &qmp.Error{Class: "GenericError", Desc: "Bus 'rp0' does not support hotplugging"}
		}
		return nil, nil
	})
	disk := unitConfig(t).Disks[1]
	ctx := context.Background()
	err := m.HotplugDisk(ctx, disk)
	var qe *qmp.Error
	if !errors.As(err, &qe) || !strings.Contains(err.Error(), "does not support hotplugging") {
		t.Fatalf("err = %v", err)
	}
	if got := srv.Commands(); !slices.Equal(got, []string{"add-fd", "blockdev-add", "device_add", "blockdev-del", "remove-fd"}) {
		t.Errorf("commands = %v", got)
	}
	for _, r := range srv.Requests()[:1] {
		if len(r.Files) != 1 || args(t, r)["fdset-id"] != float64(m.boot.lastSet+1) {
			t.Errorf("add-fd %s with %d files", r.Arguments, len(r.Files))
		}
	}
	if len(m.Disks()) != 0 {
		t.Errorf("failed disk still listed: %+v", m.Disks())
	}
	if err := m.HotplugDisk(ctx, disk); err != nil {
		t.Fatal(err)
	}
	dev := args(t, srv.Requests()[7])
	if dev["bus"] != "rp0" || dev["addr"] != "0x0" || dev["driver"] != "virtio-blk-pci" || dev["serial"] != "c1" || dev["drive"] != "nc1" {
		t.Errorf("device_add %v", dev)
	}
	second := disk
	second.ID = "c2"
	if err := m.HotplugDisk(ctx, second); err != nil {
		t.Fatal(err)
	}
	third := disk
	third.ID = "c3"
	if err := m.HotplugDisk(ctx, third); !errdefs.IsResourceExhausted(err) {
		t.Errorf("third disk on 2 ports: %v", err)
	}
	if got := m.Devices(); got[len(got)-1].Bus != "rp1" || got[len(got)-1].ID != "c2" {
		t.Errorf("devices = %+v", got)
	}
}

func TestUnplugWaitsForDeviceDeleted(t *testing.T) {
	cfg := unitConfig(t)
	cfg.Disks[1].Port = "rp2"
	srvCh := make(chan *qmptest.Server, 1)
	var mu sync.Mutex
	deleted := false
	m, srv := fakeMachine(t, cfg, func(r qmptest.Request) (any, *qmp.Error) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Execute {
		case "device_del":
			go func() {
				time.Sleep(100 * time.Millisecond)
				mu.Lock()
				deleted = true
				mu.Unlock()
				(<-srvCh).Event("DEVICE_DELETED", map[string]string{"device": "c1", "path": "/machine/peripheral/c1"})
			}()
		case "qom-list":
			if deleted {
				return []map[string]string{{"name": "rootfs"}}, nil
			}
			return []map[string]string{{"name": "rootfs"}, {"name": "c1"}}, nil
		}
		return nil, nil
	})
	srvCh <- srv
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.UnplugDisk(ctx, "rootfs"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("unplugging a root-bus disk: %v", err)
	}
	if err := m.UnplugDisk(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	cmds := srv.Commands()
	if cmds[0] != "device_del" || cmds[len(cmds)-2] != "blockdev-del" || cmds[len(cmds)-1] != "remove-fd" {
		t.Errorf("commands = %v", cmds)
	}
	if d := m.Disks(); len(d) != 1 || d[0].ID != "rootfs" {
		t.Errorf("disks = %+v", d)
	}
}

func TestSnapshotDiskNodeNames(t *testing.T) {
	cfg := unitConfig(t)
	base := cfg.Disks[1].Path
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Disks[1].Format = "raw"
	m, srv := fakeMachine(t, cfg, func(qmptest.Request) (any, *qmp.Error) { return nil, nil })
	dir := t.TempDir()
	prev := base
	for i, overlay := range []string{filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2")} {
		n := len(srv.Requests())
		if err := m.SnapshotDisk(context.Background(), "c1", overlay); err != nil {
			t.Fatal(err)
		}
		reqs := srv.Requests()[n:]
		if got := srv.Commands()[n:]; !slices.Equal(got, []string{"add-fd", "blockdev-add", "blockdev-snapshot"}) {
			t.Fatalf("snapshot %d commands %v", i, got)
		}
		oldNode, newNode := []string{"nc1", "nc1-1"}[i], []string{"nc1-1", "nc1-2"}[i]
		add := args(t, reqs[1])
		if b, ok := add["backing"]; !ok || b != nil || add["node-name"] != newNode || add["driver"] != "qcow2" {
			t.Errorf("snapshot %d blockdev-add %v: want the overlay with backing null", i, add)
		}
		if f, _ := add["file"].(map[string]any); f == nil || f["drop-cache"] != false {
			t.Errorf("snapshot %d blockdev-add %v: want its file with drop-cache false", i, add)
		}
		if a := args(t, reqs[2]); a["node"] != oldNode || a["overlay"] != newNode {
			t.Errorf("snapshot %d blockdev-snapshot %v", i, a)
		}
		if st, err := os.Stat(overlay); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("overlay %s: %v %v", overlay, st, err)
		}
		name, format, err := qcow2Backing(overlay)
		wantFormat := []string{"raw", "qcow2"}[i]
		if err != nil || name != prev || format != wantFormat {
			t.Errorf("overlay %d names backing %q (%s), %v; want %s (%s)", i, name, format, err, prev, wantFormat)
		}
		if size, _ := virtualSize(overlay, "qcow2"); size != 1<<20 {
			t.Errorf("overlay %d size %d", i, size)
		}
		prev = overlay
	}
	if err := m.SnapshotDisk(context.Background(), "nope", filepath.Join(dir, "c.qcow2")); !errdefs.IsNotFound(err) {
		t.Errorf("unknown disk: %v", err)
	}
}

func TestMonitorGoneIsClear(t *testing.T) {
	m := mustNew(t, unitConfig(t))
	if err := m.Pause(context.Background()); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Pause before Start: %v", err)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown before Start: %v", err)
	}
	m2, srv := fakeMachine(t, unitConfig(t), func(qmptest.Request) (any, *qmp.Error) { return nil, nil })
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m2.Resume(ctx); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("Resume on a closed monitor: %v", err)
	}
}

// TestResumeWaitsForMigrationFinalized: QEMU refuses cont while its
// migration thread has not left finish-migrate, though the migration is
// reported completed; Resume tries again until it is accepted, and gives
// up with the refusal when its context ends.
func TestResumeWaitsForMigrationFinalized(t *testing.T) {
	refusals := 3
	var mu sync.Mutex
	m, s := fakeMachine(t, unitConfig(t), func(r qmptest.Request) (any, *qmp.Error) {
		mu.Lock()
		defer mu.Unlock()
		if r.Execute == "cont" && refusals > 0 {
			refusals--
			return nil, &qmp.Error{Class: "GenericError", Desc: "Migration is not finalized yet"}
		}
		return struct{}{}, nil
	})
	if err := m.Resume(context.Background()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := len(s.Commands()); got != 4 {
		t.Fatalf("cont sent %d times, want 4 (3 refused)", got)
	}

	mu.Lock()
	refusals = 1 << 30
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.Resume(ctx); err == nil || !strings.Contains(err.Error(), "not finalized") {
		t.Fatalf("Resume with QEMU refusing until the deadline: %v", err)
	}

	m2, _ := fakeMachine(t, unitConfig(t), func(r qmptest.Request) (any, *qmp.Error) {
		return nil, &qmp.Error{Class: "GenericError", Desc: "Resetting the Virtual Machine is required"}
	})
	if err := m2.Resume(context.Background()); err == nil || !strings.Contains(err.Error(), "Resetting") {
		t.Fatalf("Resume refused for another reason: %v, want the refusal at once", err)
	}
}
