// Package vmm drives QEMU (7.2) for one sandbox VM: it builds the command line
// from a typed Config with an explicit PCI address for every device, runs and
// supervises the QEMU process, and saves and loads the VM's device state
// through QMP (package vmm/qmp).
//
// Lifecycle: New validates a Config; Start spawns QEMU and connects QMP; then
// Pause/Resume, HotplugDisk/UnplugDisk, SnapshotDisk, SaveState and, for a
// restored machine (Memory.Incoming), LoadState; Shutdown ends it. Cleanup removes
// what a dead machine left in its state directory, from the files alone (for
// `shim delete`).
//
// QEMU is confined unless Config.Confine says otherwise: it runs as an
// unprivileged uid of its own under its seccomp sandbox, and opens no host
// path itself; see Confinement.
//
// Checkpoint, as the shim is expected to drive it:
//
//	m.Pause(ctx)
//	m.SnapshotDisk(ctx, id, overlay) // each writable disk; the old image is now frozen
//	m.SaveState(ctx, f)              // device state only (x-ignore-shared)
//	fp, disks := m.Fingerprint(), m.Disks()
//	// RAM is Config.Memory.Path: copy it now (keep running), or os.Link it
//	// and Shutdown (stop); the owned file is removed by Shutdown.
//	m.Resume(ctx)
//
// Restore:
//
//	cfg.Memory = vmm.Memory{Mode: vmm.MemoryPrivate, Path: materializedRAM, Incoming: true}
//	cfg.Disks = disks // same order and Ports as at checkpoint, Paths to new overlays
//	if err := vmm.CheckHost(cfg, fp); err != nil { ... } // before downloading the snapshot
//	m, _ := vmm.New(cfg)
//	if err := m.CheckRestore(fp); err != nil { ... } // fingerprint.Check
//	m.Start(ctx); m.LoadState(ctx, f); m.Resume(ctx)
//
// The machine type, CPU model, accel, memory size, vCPUs, HotplugPorts, NICs
// and VMGenID must be those of the checkpointed machine; CheckRestore names
// what differs, and QEMU's own refusal (with its stderr) is in LoadState's
// error.
package vmm
