package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/internal/sparse"
	"github.com/cryo-runtime/cryo/pagefs"
	"github.com/cryo-runtime/cryo/sandbox/sharedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/vmm"
)

// capture is what the pause window produced: frozen files, ready to pack
// while the sandbox runs on.
type capture struct {
	pause time.Duration
	// parts is where the pause went, for the log: a pause longer than
	// its device state says which step to look at.
	parts pauseParts
	ram   string // RAM copy or link; "" when RAM is in the device state or served
	// gen is a served RAM sealed in the pause: read after it, closed once
	// published, abandoned if the checkpoint failed (guestMemory.lost).
	gen *pagefs.Generation
	// pages is a shared clone's RAM as split from the device state in
	// the pause: written after it, dropped once published or lost.
	pages    *sharedram.Capture
	devstate string
	disks    []frozenDisk
	record   *sandboxRecord
	fp       fingerprint.Fingerprint
	extra    []string // files to remove afterwards
}

// pauseParts are the steps of a pause window, each's duration.
type pauseParts struct {
	stop, disks, ramSync, state, ramCapture, resume time.Duration
}

// fields are the parts measured as log fields. A shared clone's stop
// and device state are inside its live save: not measured apart.
func (p pauseParts) fields() log.Fields {
	f := log.Fields{}
	for name, d := range map[string]time.Duration{"pause_stop": p.stop, "pause_disks": p.disks, "pause_ram_sync": p.ramSync,
		"pause_state": p.state, "pause_ram_capture": p.ramCapture, "pause_resume": p.resume} {
		if d > 0 {
			f[name] = d
		}
	}
	return f
}

// since is the time since *t, and moves *t to now: the next part starts
// where this one ended.
func since(t *time.Time) time.Duration {
	now := time.Now()
	d := now.Sub(*t)
	*t = now
	return d
}

type frozenDisk struct {
	rec    recordDisk
	path   string // the frozen image
	format string
}

func (c *capture) cleanup() {
	if c.gen != nil {
		// Neither published nor lost: its pages stay dirty, for the next
		// checkpoint.
		c.gen.Abandon()
		c.gen = nil
	}
	if c.pages != nil {
		c.pages.Close()
		c.pages = nil
	}
	for _, f := range c.extra {
		os.Remove(f)
	}
}

// pauser is the part of the VM the pause window drives (a *vmm.Machine).
type pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	SaveState(ctx context.Context, w *os.File) error
	SaveStateLive(ctx context.Context, w *os.File, o vmm.LiveSave) error
	SnapshotDisk(ctx context.Context, id, overlayPath string) error
	Disks() []vmm.Disk
	Fingerprint() fingerprint.Fingerprint
}

// vcpus is the captured VM's vCPU count (0 if unknown).
func (c *capture) vcpus() int {
	if c == nil || c.record == nil {
		return 0
	}
	return c.record.VCPUs
}

// captureVM stops the VM, freezes every writable disk behind a new qcow2
// overlay, saves the device state and takes the RAM (its guestMemory
// says how), then lets the VM run on unless keepStopped.
func captureVM(ctx context.Context, sb *Sandbox, record *sandboxRecord, work string, exit, keepStopped bool) (*capture, error) {
	return pauseWindow(ctx, sb.vm, sb.mem, sb.spec.DiskDir, record, work, exit, keepStopped)
}

// pauseWindow is captureVM on its parts. The RAM is readied before the
// pause (most of it written back, a served RAM's side file made) and
// written back in it (what the guest dirtied since, one fsync), then
// captured once the device state is saved: a served RAM is sealed, the
// device state then carries no RAM (x-ignore-shared) and nothing of the
// RAM is copied in the pause. On failure the VM runs on (unless it was
// stopped already), then the RAM drops what was readied and gives back
// what was sealed.
func pauseWindow(ctx context.Context, vm pauser, ram guestMemory, diskDir string, record *sandboxRecord, work string, exit, keepStopped bool) (_ *capture, retErr error) {
	c := &capture{record: record}
	defer func() {
		if retErr != nil {
			ram.lost(context.WithoutCancel(ctx), c)
			c.cleanup()
		}
	}()

	flushDisks(ctx, vm.Disks())
	if err := ram.preSync(); err != nil {
		return nil, fmt.Errorf("write back guest ram before the pause: %w", err)
	}
	resumed := false
	defer func() {
		if !resumed && (retErr != nil || !keepStopped) {
			if err := vm.Resume(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).Error("resume vm after checkpoint")
			}
		}
	}()
	c.devstate = filepath.Join(work, "devstate")
	t0, err := stopAndSave(ctx, vm, ram, c, diskDir)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	if err := ram.capture(c, exit); err != nil {
		return nil, err
	}
	c.parts.ramCapture = since(&t)
	c.fp = vm.Fingerprint()
	if !keepStopped {
		if err := vm.Resume(ctx); err != nil {
			return nil, fmt.Errorf("resume vm: %w", err)
		}
	}
	resumed = true
	c.parts.resume = since(&t)
	c.pause = time.Since(t0)
	return c, nil
}

// stopAndSave stops the VM, freezes its disks, writes back the RAM and
// saves the device state to c.devstate, and returns when the VM stopped.
// A RAM that the device state carries (stateSplitter) is sent while the
// guest runs, and the VM stops inside the save, for the last pass: the
// disks freeze there.
func stopAndSave(ctx context.Context, vm pauser, ram guestMemory, c *capture, diskDir string) (time.Time, error) {
	stopped := func(ctx context.Context) error {
		t := time.Now()
		if err := c.freezeDisks(ctx, vm, diskDir); err != nil {
			return err
		}
		c.parts.disks = since(&t)
		if err := ram.sync(); err != nil {
			return fmt.Errorf("write back guest ram: %w", err)
		}
		c.parts.ramSync = since(&t)
		return nil
	}
	if s, ok := ram.(stateSplitter); ok {
		var t0 time.Time
		err := splitState(ctx, vm, s, c, func(ctx context.Context, stop time.Time) error {
			t0 = stop
			return stopped(ctx)
		})
		return t0, err
	}
	t0 := time.Now()
	if err := vm.Pause(ctx); err != nil {
		return t0, fmt.Errorf("stop vm: %w", err)
	}
	c.parts.stop = time.Since(t0)
	if err := stopped(ctx); err != nil {
		return t0, err
	}
	t := time.Now()
	f, err := os.OpenFile(c.devstate, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return t0, err
	}
	defer f.Close()
	if err := vm.SaveState(ctx, f); err != nil {
		return t0, fmt.Errorf("save device state: %w", err)
	}
	c.parts.state = time.Since(t)
	return t0, nil
}

// stateSplitter is a guestMemory whose RAM QEMU streams with the device
// state (a private mapping): it takes the RAM out of the stream as QEMU
// writes it.
type stateSplitter interface {
	splitState(ctx context.Context, c *capture, state io.Reader, out io.Writer) error
}

// splitState saves the device state live (vmm.Machine.SaveStateLive)
// through s, which takes the RAM out of the stream as QEMU writes it;
// stopped runs in the stop.
func splitState(ctx context.Context, vm pauser, s stateSplitter, c *capture, stopped func(context.Context, time.Time) error) error {
	f, err := os.OpenFile(c.devstate, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	// The RAM streams through it: fewer, larger writes.
	_, _ = unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, 1<<20)
	split := make(chan error, 1)
	go func() {
		err := s.splitState(ctx, c, pr, f)
		// QEMU must not block on a pipe no one reads: drain what is
		// left, the migration then ends (failed or not).
		io.Copy(io.Discard, pr)
		pr.Close()
		split <- err
	}()
	err = vm.SaveStateLive(ctx, pw, vmm.LiveSave{Stopped: stopped})
	pw.Close()
	if err != nil {
		// A failed migration's QEMU may hold its end of the pipe open:
		// the reader ends now.
		pr.Close()
		err = fmt.Errorf("save device state: %w", err)
	}
	return errors.Join(err, <-split)
}

// freezeDisks puts every writable disk behind a new overlay: the frozen
// image is the checkpoint's.
func (c *capture) freezeDisks(ctx context.Context, vm pauser, diskDir string) error {
	for _, d := range vm.Disks() {
		if d.ReadOnly {
			continue
		}
		overlay := filepath.Join(diskDir, fmt.Sprintf("%s-%d.qcow2", d.ID, time.Now().UnixNano()))
		if err := vm.SnapshotDisk(ctx, d.ID, overlay); err != nil {
			return fmt.Errorf("freeze disk %s: %w", d.ID, err)
		}
		rec := recordDisk{Name: d.ID, ID: d.ID, Serial: d.Serial, Port: d.Port}
		c.disks = append(c.disks, frozenDisk{rec: rec, path: d.Path, format: d.Format})
		c.record.Disks = append(c.record.Disks, rec)
	}
	return nil
}

// takeRAM links (exit) or copies a booted VM's shared RAM file.
func (c *capture) takeRAM(path string, exit bool) error {
	c.ram = filepath.Join(filepath.Dir(path), fmt.Sprintf("cryo-ckpt-%d.ram", time.Now().UnixNano()))
	c.extra = append(c.extra, c.ram)
	var err error
	if exit {
		err = os.Link(path, c.ram)
	} else {
		err = sparse.Copy(c.ram, path, -1)
	}
	if err != nil {
		return fmt.Errorf("capture guest ram: %w", err)
	}
	return nil
}

// flatten turns the frozen disks into raw images (sparse; qcow2 chains are
// read through qemu-img) and returns the snapshot's source files.
func (c *capture) flatten(ctx context.Context, work string) (snapshot.SourcePaths, error) {
	spec, err := json.Marshal(c.record)
	if err != nil {
		return snapshot.SourcePaths{}, err
	}
	p := snapshot.SourcePaths{RAM: c.ram, DevState: c.devstate, Spec: spec, Disks: map[string]string{}}
	for _, d := range c.disks {
		if d.format == "raw" {
			p.Disks[d.rec.Name] = d.path
			continue
		}
		raw := filepath.Join(work, "disk-"+d.rec.Name+".raw")
		if err := run(ctx, "qemu-img", "convert", "-U", "-f", d.format, "-O", "raw", d.path, raw); err != nil {
			return p, fmt.Errorf("flatten disk %s: %w", d.rec.Name, err)
		}
		p.Disks[d.rec.Name] = raw
	}
	return p, nil
}

// record describes the sandbox for a restore.
func (c *checkpointing) record() *sandboxRecord {
	sb := c.sb
	cfg := sb.vm.Config()
	r := &sandboxRecord{
		Version: recordVersion, SandboxID: sb.guestID, VCPUs: cfg.VCPUs, MemoryMiB: cfg.MemoryMiB, HotplugPort: cfg.HotplugPorts,
		Finished: c.req.Finished,
	}
	if sb.net != nil {
		r.NICMAC = sb.net.ep.MAC.String()
	}
	for _, ct := range c.req.Containers {
		r.Containers = append(r.Containers, RecordContainer{
			GuestID: ct.GuestID, Spec: ct.Spec, Name: ct.Name, Disk: ct.Disk,
		})
	}
	return r
}

// metadata is the snapshot's config blob.
func (c *checkpointing) metadata() snapshot.Metadata {
	sb, pod := c.sb, c.req.Pod
	host, _ := os.Hostname()
	md := snapshot.Metadata{
		Fingerprint: c.cap.fp,
		Source: snapshot.SourceInfo{
			SandboxID: sb.spec.ID, RuntimeType: sb.spec.Node.RuntimeType, Node: host,
			PodName: pod.Name, Namespace: pod.Namespace, PodUID: pod.UID,
		},
		// For a controller that weighs checkpoints; publish adds what the
		// write uploaded.
		Annotations: map[string]string{snapshot.AnnotationPauseWindow: c.cap.pause.Round(time.Microsecond).String()},
	}
	if c.req.TTL > 0 {
		md.Expires = time.Now().Add(c.req.TTL)
	}
	for _, ct := range c.req.Containers {
		md.Containers = append(md.Containers, snapshot.Container{ID: ct.GuestID, Image: ct.Image})
	}
	return md
}

// flushDisks writes back, while the guest still runs, what it wrote to its
// writable disks: freezing a disk in the pause window flushes it, and that
// flush should find little to do whatever the disk's size and how much the
// guest wrote. Best effort: the freeze flushes anyway.
func flushDisks(ctx context.Context, disks []vmm.Disk) {
	for _, d := range disks {
		if d.ReadOnly {
			continue
		}
		f, err := os.Open(d.Path)
		if err == nil {
			err = unix.Fdatasync(int(f.Fd()))
			f.Close()
		}
		if err != nil {
			log.G(ctx).WithError(err).WithField("disk", d.ID).Debug("checkpoint: write back disk before the pause")
		}
	}
}
