package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/vmm/qmp"
)

// DefaultUnplugTimeout bounds UnplugDisk when the caller's context has no
// deadline: unplugging needs the guest to acknowledge the ACPI eject.
const DefaultUnplugTimeout = 30 * time.Second

// Disks returns the disks attached now, in attach order; hot-plugged ones
// have Port set and snapshotted ones the overlay as Path.
func (m *Machine) Disks() []Disk {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Disk(nil), m.disks...)
}

// Devices returns the guest-visible devices now, with their PCI addresses.
func (m *Machine) Devices() []Device {
	return layout(m.cfg, m.Disks())
}

// HotplugDisk attaches d to a free pre-created root port (blockdev-add, then
// device_add virtio-blk-pci). d.Port, if set, picks the port.
func (m *Machine) HotplugDisk(ctx context.Context, d Disk) (retErr error) {
	if d.Format == "" {
		d.Format = "raw"
	}
	if err := d.validate(); err != nil {
		return fmt.Errorf("hotplug disk into vm %s: %w: %v", m.cfg.ID, errdefs.ErrInvalidArgument, err)
	}
	wrap := func(err error) error { return fmt.Errorf("hotplug disk %s into vm %s: %w", d.ID, m.cfg.ID, err) }

	m.mu.Lock()
	port, err := m.reservePort(d)
	if err != nil {
		m.mu.Unlock()
		return wrap(err)
	}
	d.Port = port
	node := nodeName(d.ID)
	m.disks = append(m.disks, d) // reserved; removed again on failure
	m.nodes[d.ID] = node
	m.mu.Unlock()
	defer func() {
		if retErr != nil {
			m.forgetDisk(d.ID)
		}
	}()

	if err := m.execute(ctx, "blockdev-add", blockdevArgs(d, node), nil); err != nil {
		return wrap(err)
	}
	dev := diskDevice(d, 0)
	if err := m.execute(ctx, "device_add", diskDeviceArgs(d, dev, node), nil); err != nil {
		m.execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node}, nil)
		return wrap(err)
	}
	return nil
}

// reservePort checks d against the attached disks and returns its port.
// Called with m.mu held.
func (m *Machine) reservePort(d Disk) (string, error) {
	used := map[string]bool{}
	for _, x := range m.disks {
		if x.ID == d.ID {
			return "", fmt.Errorf("%w: disk id %q in use", errdefs.ErrAlreadyExists, d.ID)
		}
		used[x.Port] = true
	}
	for _, n := range m.cfg.NICs {
		if n.ID == d.ID {
			return "", fmt.Errorf("%w: device id %q in use", errdefs.ErrAlreadyExists, d.ID)
		}
	}
	if d.Port != "" {
		if portIndex(d.Port) >= m.cfg.HotplugPorts {
			return "", fmt.Errorf("%w: no port %s", errdefs.ErrInvalidArgument, d.Port)
		}
		if used[d.Port] {
			return "", fmt.Errorf("%w: port %s is busy", errdefs.ErrAlreadyExists, d.Port)
		}
		return d.Port, nil
	}
	for i := 0; i < m.cfg.HotplugPorts; i++ {
		if !used[portID(i)] {
			return portID(i), nil
		}
	}
	return "", fmt.Errorf("%w: all %d hot-plug ports are in use", errdefs.ErrResourceExhausted, m.cfg.HotplugPorts)
}

func (m *Machine) forgetDisk(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range m.disks {
		if x.ID == id {
			m.disks = append(m.disks[:i:i], m.disks[i+1:]...)
			break
		}
	}
	delete(m.nodes, id)
}

// UnplugDisk detaches a hot-plugged disk: device_del, wait for the guest to
// release it (DEVICE_DELETED), then blockdev-del. Disks on the root bus
// cannot be unplugged.
func (m *Machine) UnplugDisk(ctx context.Context, id string) error {
	wrap := func(err error) error { return fmt.Errorf("unplug disk %s from vm %s: %w", id, m.cfg.ID, err) }
	m.mu.Lock()
	var d *Disk
	for i := range m.disks {
		if m.disks[i].ID == id {
			d = &m.disks[i]
		}
	}
	node := m.nodes[id]
	m.mu.Unlock()
	if d == nil {
		return wrap(errdefs.ErrNotFound)
	}
	if d.Port == "" {
		return wrap(fmt.Errorf("%w: disk is on the root bus, which is not hot-pluggable", errdefs.ErrFailedPrecondition))
	}
	mon, err := m.monitor()
	if err != nil {
		return wrap(err)
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultUnplugTimeout)
	defer cancel()
	events, unsubscribe := mon.Subscribe(32)
	defer unsubscribe()
	if err := m.execute(ctx, "device_del", map[string]any{"id": id}, nil); err != nil {
		return wrap(err)
	}
	if err := m.waitDeviceGone(ctx, id, events); err != nil {
		return wrap(err)
	}
	if err := m.execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil); err != nil {
		return wrap(err)
	}
	m.forgetDisk(id)
	return nil
}

// waitDeviceGone waits for DEVICE_DELETED of id, and also polls the QOM
// tree in case the event was missed.
func (m *Machine) waitDeviceGone(ctx context.Context, id string, events <-chan qmp.Event) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("qmp connection closed%s", stderrSuffix(m.Stderr()))
			}
			if ev.Name == "DEVICE_DELETED" {
				var data struct{ Device string }
				if json.Unmarshal(ev.Data, &data) == nil && data.Device == id {
					return nil
				}
			}
		case <-tick.C:
			var children []struct{ Name string }
			if err := m.execute(ctx, "qom-list", map[string]any{"path": "/machine/peripheral"}, &children); err != nil {
				return err
			}
			present := false
			for _, c := range children {
				present = present || c.Name == id
			}
			if !present {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("guest did not release the device: %w", ctx.Err())
		}
	}
}

// SnapshotDisk freezes disk id's current image and redirects its writes to a
// new qcow2 overlay at overlayPath, which QEMU creates with the old image as
// backing file (blockdev-snapshot-sync). The frozen image can then be read
// while the guest runs. Call it while the guest is paused, before SaveState.
func (m *Machine) SnapshotDisk(ctx context.Context, id, overlayPath string) error {
	wrap := func(err error) error { return fmt.Errorf("snapshot disk %s of vm %s: %w", id, m.cfg.ID, err) }
	if !filepath.IsAbs(overlayPath) {
		return wrap(fmt.Errorf("%w: overlay path %q is not absolute", errdefs.ErrInvalidArgument, overlayPath))
	}
	m.mu.Lock()
	node, ok := m.nodes[id]
	m.nodeSeq++
	newNode := nodeName(id) + "-" + strconv.Itoa(m.nodeSeq)
	m.mu.Unlock()
	if !ok {
		return wrap(errdefs.ErrNotFound)
	}
	// QEMU would create the overlay world-readable; the guest's data is not.
	f, err := os.OpenFile(overlayPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return wrap(err)
	}
	f.Chmod(0o600)
	f.Close()
	args := map[string]any{
		"node-name":          node,
		"snapshot-file":      overlayPath,
		"snapshot-node-name": newNode,
		"format":             "qcow2",
		"mode":               "absolute-paths",
	}
	if err := m.execute(ctx, "blockdev-snapshot-sync", args, nil); err != nil {
		os.Remove(overlayPath)
		return wrap(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[id] = newNode
	for i := range m.disks {
		if m.disks[i].ID == id {
			m.disks[i].Path, m.disks[i].Format = overlayPath, "qcow2"
		}
	}
	return nil
}
