package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/qcow2"
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

	chain, err := imageChain(d.Path, d.Format)
	if err != nil {
		return wrap(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err))
	}
	sets, err := m.passChain(ctx, chain, d.ReadOnly)
	if err != nil {
		return wrap(err)
	}
	if err := m.execute(ctx, "blockdev-add", chainNode(chain, sets, node, d.ReadOnly), nil); err != nil {
		m.removeFDSets(ctx, sets)
		return wrap(err)
	}
	dev := diskDevice(d, 0)
	if err := m.execute(ctx, "device_add", diskDeviceArgs(d, dev, node), nil); err != nil {
		m.execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node}, nil)
		m.removeFDSets(ctx, sets)
		return wrap(err)
	}
	m.mu.Lock()
	m.fdsets[d.ID] = sets
	m.mu.Unlock()
	return nil
}

// passChain opens every file of chain (as root) and adds it to a new fd set
// of QEMU's (QMP add-fd), one set per image; it returns the sets.
func (m *Machine) passChain(ctx context.Context, chain *image, readOnly bool) ([]int, error) {
	mon, err := m.monitor()
	if err != nil {
		return nil, err
	}
	sets, files := chainFiles(chain, readOnly, func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.lastSet++
		return m.lastSet
	})
	for _, pf := range files {
		if err := addFD(ctx, mon, pf); err != nil {
			m.removeFDSets(ctx, sets)
			return nil, m.explain("add-fd", err)
		}
	}
	return sets, nil
}

func addFD(ctx context.Context, mon *qmp.Client, pf passedFile) error {
	f, err := os.OpenFile(pf.path, pf.flag, 0)
	if err != nil {
		return err
	}
	defer f.Close() // QEMU keeps its own copy
	ctx, cancel := withDefaultTimeout(ctx, DefaultCommandTimeout)
	defer cancel()
	_, err = mon.ExecuteWithFile(ctx, "add-fd", map[string]any{"fdset-id": pf.set, "opaque": pf.path}, f)
	return err
}

// removeFDSets drops fd sets QEMU no longer uses (best effort: QEMU closes
// a descriptor once no block node holds a duplicate of it).
func (m *Machine) removeFDSets(ctx context.Context, sets []int) {
	for _, s := range sets {
		m.execute(context.WithoutCancel(ctx), "remove-fd", map[string]any{"fdset-id": s}, nil)
	}
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

// forgetDisk drops disk id and returns the fd sets its nodes used.
func (m *Machine) forgetDisk(id string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range m.disks {
		if x.ID == id {
			m.disks = append(m.disks[:i:i], m.disks[i+1:]...)
			break
		}
	}
	delete(m.nodes, id)
	sets := m.fdsets[id]
	delete(m.fdsets, id)
	return sets
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
	m.removeFDSets(ctx, m.forgetDisk(id))
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
// new qcow2 overlay at overlayPath (mode 0600), whose header names the old
// image as backing file. The frozen image can then be read while the guest
// runs. Call it while the guest is paused, before SaveState.
//
// The machine writes the overlay itself and hands it to QEMU as a
// descriptor (blockdev-add with no backing, then blockdev-snapshot):
// blockdev-snapshot-sync would have a confined QEMU create the file, and
// name its backing file by the descriptor path QEMU opened it by.
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
	var cur Disk
	for _, x := range m.Disks() {
		if x.ID == id {
			cur = x
		}
	}
	if err := m.createOverlay(ctx, cur, overlayPath, node, newNode); err != nil {
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

// createOverlay writes an empty overlay over cur at path and makes it the
// top of node (as newNode).
func (m *Machine) createOverlay(ctx context.Context, cur Disk, path, node, newNode string) error {
	size, err := virtualSize(cur.Path, cur.Format)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := qcow2.CreateOverlayOf(path, cur.Path, cur.Format, size); err != nil {
		return err
	}
	top := &image{path: path, format: "qcow2"} // its backing is node, already open
	sets, err := m.passChain(ctx, top, false)
	if err != nil {
		return err
	}
	add := map[string]any{
		"driver": "qcow2", "node-name": newNode, "backing": nil,
		"file": fileNode(fdsetPath(sets[0]), false),
	}
	if err := m.execute(ctx, "blockdev-add", add, nil); err != nil {
		m.removeFDSets(ctx, sets)
		return err
	}
	if err := m.execute(ctx, "blockdev-snapshot", map[string]any{"node": node, "overlay": newNode}, nil); err != nil {
		m.execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": newNode}, nil)
		m.removeFDSets(ctx, sets)
		return err
	}
	m.mu.Lock()
	m.fdsets[cur.ID] = append(m.fdsets[cur.ID], sets...)
	m.mu.Unlock()
	return nil
}
