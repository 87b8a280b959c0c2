package vmm

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/cryo-runtime/cryo/vmm/qmp"
)

// LiveSave says how SaveStateLive converges and what runs in its pause.
type LiveSave struct {
	// Converge is how long the guest runs while QEMU sends its RAM before
	// QEMU is told to stop it whatever is left to send (0: about two
	// passes over the machine's RAM, convergeFor). A guest that writes
	// slower than the stream converges sooner by itself.
	Converge time.Duration
	// Stopped runs once QEMU has stopped the VM and before it sends what
	// the guest dirtied since its last pass and the device state: the
	// disks are frozen there, in the same stop. stop is when QEMU stopped
	// the VM (its STOP event). An error cancels the save.
	Stopped func(ctx context.Context, stop time.Time) error
}

const (
	// liveDowntime is the downtime QEMU aims at while the guest runs (ms):
	// it stops the VM once what is left to send takes about this long.
	liveDowntime = 20
	// maxDowntime is QEMU's largest downtime limit (ms): set past
	// Converge, it makes the next pass the last.
	maxDowntime = 2000 * 1000
)

// SaveStateLive writes the device state to w as SaveState does, for a
// machine whose RAM the stream carries (MemoryPrivate): QEMU sends the RAM
// while the guest runs, as a live migration's precopy does, pass after
// pass of what the guest dirtied, and stops the VM only for the last pass
// and the device state. It pauses there (pause-before-switchover) for
// o.Stopped, so that the disks freeze in the same stop. Every page's last
// copy in the stream is its content at the stop. The machine remains
// paused (postmigrate) until Resume.
//
// Under TCG the VM stops before the first pass instead (stopsFirst): the
// whole RAM is then sent in the pause.
func (m *Machine) SaveStateLive(ctx context.Context, w *os.File, o LiveSave) (retErr error) {
	ctx, cancel := withDefaultTimeout(ctx, DefaultMigrationTimeout)
	defer cancel()
	if o.Converge <= 0 {
		o.Converge = convergeFor(m.cfg.MemoryMiB)
	}
	mon, err := m.monitor()
	if err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	events, unsubscribe := mon.Subscribe(64)
	defer unsubscribe()
	name, stoppedAt, err := m.startLiveSave(ctx, w)
	if err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	defer func() {
		if retErr != nil {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			m.execute(cctx, "migrate_cancel", nil, nil)
			m.execute(cctx, "closefd", map[string]any{"fdname": name}, nil)
			ccancel()
		}
	}()
	stop, err := m.awaitSwitchover(ctx, events, o.Converge)
	if err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	if !stoppedAt.IsZero() {
		stop = stoppedAt
	}
	if err := o.Stopped(ctx, stop); err != nil {
		return err
	}
	if err := m.execute(ctx, "migrate-continue", map[string]any{"state": "pre-switchover"}, nil); err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	if err := m.waitMigration(ctx, events); err != nil {
		return fmt.Errorf("save vm %s: %w", m.cfg.ID, err)
	}
	return nil
}

// convergeFor is a live save's default converge time for a guest of
// memMiB: about two passes over its RAM at the stream's speed on a small
// node (about 1 GB/s), at least a second.
func convergeFor(memMiB int) time.Duration {
	return time.Second + time.Duration(memMiB)*2*time.Millisecond
}

// stopsFirst says whether a live save must stop the VM before its first
// pass. Under TCG, a guest's writes reach QEMU's dirty bitmap only through
// its softmmu TLB, and QEMU before 9.0 does not re-arm the TLB when a
// pass clears the bitmap (upstream 03bfc2188f, "physmem: Fix migration
// dirty bitmap coherency with TCG memory access"): writes after the
// first pass go unseen, and the stream's last copy of a page is older
// than the stop. On QEMU 7.2 a restored guest then crashed in about one
// checkpoint of seven of a guest that writes. Upstream reports other lost
// writes under TCG after that fix, so TCG stops first whatever the
// version; KVM's dirty log has no such gap.
func (m *Machine) stopsFirst() bool { return m.cfg.Accel != "kvm" }

// startLiveSave starts the outgoing migration, with the guest running
// unless stopsFirst: then it stops the VM first and returns when.
func (m *Machine) startLiveSave(ctx context.Context, w *os.File) (string, time.Time, error) {
	caps := []map[string]any{
		{"capability": "x-ignore-shared", "state": true},
		{"capability": "pause-before-switchover", "state": true},
		{"capability": "events", "state": true},
	}
	params := map[string]any{"max-bandwidth": int64(1) << 40, "downtime-limit": liveDowntime}
	if err := m.setMigration(ctx, caps, params); err != nil {
		return "", time.Time{}, err
	}
	name, err := m.passFD(ctx, w)
	if err != nil {
		return "", time.Time{}, err
	}
	var stopped time.Time
	if m.stopsFirst() {
		stopped = time.Now()
		if err := m.execute(ctx, "stop", nil, nil); err != nil {
			return name, stopped, fmt.Errorf("stop before the save (tcg): %w", err)
		}
	}
	if err := m.execute(ctx, "migrate", map[string]any{"uri": "fd:" + name}, nil); err != nil {
		return name, stopped, err
	}
	return name, stopped, nil
}

// awaitSwitchover waits for the migration to pause before its switchover,
// the VM stopped, and returns when QEMU stopped it. Past converge, the
// downtime limit is raised so that QEMU stops the VM at its next pass.
func (m *Machine) awaitSwitchover(ctx context.Context, events <-chan qmp.Event, converge time.Duration) (time.Time, error) {
	var stop time.Time
	deadline := time.NewTimer(converge)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case ev := <-events:
			if ev.Name == "STOP" {
				stop = ev.Timestamp
			}
		case <-deadline.C:
			m.forgetMigration()
			if err := m.execute(ctx, "migrate-set-parameters", map[string]any{"downtime-limit": maxDowntime}, nil); err != nil {
				return stop, err
			}
		case <-poll.C:
		case <-m.exited:
			return stop, fmt.Errorf("qemu exited during migration%s", stderrSuffix(m.Stderr()))
		case <-ctx.Done():
			return stop, fmt.Errorf("migration did not stop the vm: %w", ctx.Err())
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.execute(ctx, "query-migrate", nil, &st); err != nil {
			return stop, err
		}
		switch st.Status {
		case "pre-switchover":
			if stop.IsZero() {
				stop = time.Now() // the STOP event was missed
			}
			return stop, nil
		case "completed", "failed", "cancelled":
			return stop, fmt.Errorf("migration %s before its switchover: %s%s", st.Status, st.ErrorDesc, stderrSuffix(m.Stderr()))
		}
	}
}
