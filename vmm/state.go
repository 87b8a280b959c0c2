package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/vmm/qmp"
)

// DefaultMigrationTimeout bounds SaveState and LoadState when the caller's
// context has no deadline. With RAM kept out of the stream the device state
// is a few hundred KB and takes well under a second.
const DefaultMigrationTimeout = 2 * time.Minute

// SaveState pauses the guest and writes its device state to w through a
// passed file descriptor (QMP getfd and migrate "fd:NAME"; no shell). With
// x-ignore-shared, guest RAM is not in the stream: it stays in Memory.Path,
// which the caller captures while the VM is paused (or after Shutdown, by
// hard-linking the file first). The machine remains paused (state
// "postmigrate") and its disk images are inactive until Resume; take disk
// snapshots (SnapshotDisk) before SaveState.
//
// A machine restored with MemoryPrivate maps its RAM privately, so
// x-ignore-shared does not apply to it and the stream carries the whole RAM.
func (m *Machine) SaveState(ctx context.Context, w *os.File) error {
	ctx, cancel := withDefaultTimeout(ctx, DefaultMigrationTimeout)
	defer cancel()
	start := time.Now()
	if err := m.migrate(ctx, w, "migrate", true); err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	log.G(ctx).WithFields(log.Fields{"id": m.cfg.ID, "duration": time.Since(start)}).Debug("vm state saved")
	return nil
}

// LoadState loads device state saved by SaveState from r into a machine
// restored (Memory.Incoming). RAM comes from Memory.Path. The guest stays paused
// until Resume. If the stream does not fit this machine, QEMU exits and the
// error carries its message (e.g. "Unknown ramblock", "Length mismatch").
func (m *Machine) LoadState(ctx context.Context, r *os.File) error {
	if !m.cfg.Memory.Incoming {
		return fmt.Errorf("load vm %s: %w: machine was booted, not restored (memory %v)", m.cfg.ID, errdefs.ErrFailedPrecondition, m.cfg.Memory.Mode)
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultMigrationTimeout)
	defer cancel()
	start := time.Now()
	if err := m.migrate(ctx, r, "migrate-incoming", false); err != nil {
		return fmt.Errorf("load vm %s: %w", m.cfg.ID, err)
	}
	log.G(ctx).WithFields(log.Fields{"id": m.cfg.ID, "duration": time.Since(start)}).Debug("vm state loaded")
	return nil
}

// migrate runs an outgoing ("migrate") or incoming ("migrate-incoming")
// migration through f and waits for it to complete. An outgoing one runs
// inside the caller's pause, so it spends no QMP round trip it can skip:
// no second stop after Pause, capabilities and parameters only when they
// changed, and its end is QEMU's MIGRATION event, not the next poll.
func (m *Machine) migrate(ctx context.Context, f *os.File, cmd string, outgoing bool) error {
	mon, err := m.monitor()
	if err != nil {
		return err
	}
	events, unsubscribe := mon.Subscribe(16)
	defer unsubscribe()
	if outgoing && !m.isPaused() {
		if err := m.execute(ctx, "stop", nil, nil); err != nil {
			return err
		}
	}
	// pause-before-switchover is SaveStateLive's: a save of the same
	// machine after one must not wait for a migrate-continue.
	caps := []map[string]any{
		{"capability": "x-ignore-shared", "state": true},
		{"capability": "pause-before-switchover", "state": false},
		{"capability": "events", "state": true},
	}
	var params map[string]any
	if outgoing {
		// The default bandwidth limit (32 MiB/s) would throttle a local file.
		params = map[string]any{"max-bandwidth": int64(1) << 40}
	}
	if err := m.setMigration(ctx, caps, params); err != nil {
		return err
	}
	name, err := m.passFD(ctx, f)
	if err != nil {
		return err
	}
	if err := m.execute(ctx, cmd, map[string]any{"uri": "fd:" + name}, nil); err != nil {
		m.execute(context.WithoutCancel(ctx), "closefd", map[string]any{"fdname": name}, nil)
		return err
	}
	if err := m.waitMigration(ctx, events); err != nil {
		if outgoing {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			m.execute(cctx, "migrate_cancel", nil, nil)
			ccancel()
		}
		return err
	}
	return nil
}

// setMigration sets the migration capabilities caps and the parameters
// params (none when nil), unless they are what this machine last set.
func (m *Machine) setMigration(ctx context.Context, caps []map[string]any, params map[string]any) error {
	key, err := json.Marshal([]any{caps, params})
	if err != nil {
		return err
	}
	m.mu.Lock()
	same := m.migSet == string(key)
	m.mu.Unlock()
	if same {
		return nil
	}
	m.forgetMigration() // until both are set
	if err := m.execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps}, nil); err != nil {
		return err
	}
	if params != nil {
		if err := m.execute(ctx, "migrate-set-parameters", params, nil); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.migSet = string(key)
	m.mu.Unlock()
	return nil
}

// forgetMigration: the capabilities or parameters changed outside
// setMigration, so the next one sets them again.
func (m *Machine) forgetMigration() {
	m.mu.Lock()
	m.migSet = ""
	m.mu.Unlock()
}

// passFD hands f to QEMU under a fresh name (QMP getfd).
func (m *Machine) passFD(ctx context.Context, f *os.File) (string, error) {
	mon, err := m.monitor()
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	m.fdSeq++
	name := "cryo-fd" + strconv.Itoa(m.fdSeq)
	m.mu.Unlock()
	ctx, cancel := withDefaultTimeout(ctx, DefaultCommandTimeout)
	defer cancel()
	if _, err := mon.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": name}, f); err != nil {
		return "", m.explain("getfd", err)
	}
	return name, nil
}

// waitMigration waits until the migration completed, failed, QEMU exited
// (a failed incoming migration ends QEMU) or ctx ended. QEMU's MIGRATION
// events (the events capability) end the wait as they come: a completed
// one at once, any other with a query-migrate. query-migrate is also
// polled, more and more slowly, for an event missed (a full buffer).
func (m *Machine) waitMigration(ctx context.Context, events <-chan qmp.Event) error {
	delay := 2 * time.Millisecond
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.execute(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s%s", st.Status, st.ErrorDesc, stderrSuffix(m.Stderr()))
		}
		completed, err := func() (bool, error) {
			poll := time.NewTimer(delay)
			defer poll.Stop()
			for {
				select {
				case ev, ok := <-events:
					switch {
					case !ok:
						events = nil // the connection ended: m.exited tells
					case ev.Name == "MIGRATION":
						return migrationStatus(ev) == "completed", nil
					}
				case <-m.exited:
					return false, fmt.Errorf("qemu exited during migration%s", stderrSuffix(m.Stderr()))
				case <-ctx.Done():
					return false, fmt.Errorf("migration still %q: %w", st.Status, ctx.Err())
				case <-poll.C:
					return false, nil
				}
			}
		}()
		if completed || err != nil {
			return err
		}
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// migrationStatus is the status a MIGRATION event reports.
func migrationStatus(ev qmp.Event) string {
	var d struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(ev.Data, &d)
	return d.Status
}
