package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cryo-runtime/cryo/bench"
	"github.com/cryo-runtime/cryo/configs"
)

func newBenchCommand(a *App) *cobra.Command {
	var (
		quick, full bool
		sz          = bench.Default()
		o           bench.Options
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure cold boot, restore, clone fan-out, pause windows and the restore pipeline on this machine",
		Long: `bench starts a private containerd with the cryo runtime and a loopback S3 server
(versitygw), runs real VMs and prints medians, ratios and the performance targets
(PASS/MISS). Everything it starts is stopped and removed at the end, on error and
on Ctrl-C. It needs root, QEMU, the tools of ` + "`make tools`" + ` and the binaries and guest
image of ` + "`make binaries guest`" + ` (--bin, --guest-dir, --tools or CRYO_BIN,
CRYO_GUEST_DIR, CRYO_TOOLS).

Sizes: the default fits a small shared machine (512 MiB large guest, 2 GiB large
disk, up to 4 clones, 10 s warm-up, 3 runs per median); --quick runs every row once
with the smallest sizes; --full uses 1 GiB guests, 8 GiB disks, 8 clones and a 20 s
warm-up. Flags given explicitly override the preset.

Issue 21's rows (step "pause and clone memory"): a writer in the guest keeps
writing every page of --pause-ram MiB (256 and 1024 by default and in --quick,
also 4096 in --full) while a booted and then a lazily restored sandbox is
checkpointed: the pause windows, their ratio largest / smallest, the writer's
speed idle and during the checkpoint; the summed QEMU Pss of 1 and of
--pss-clones lazy clones of one snapshot (4 in --quick, else 8); and the same
for 1 and --warm-clones lazy clones of a warm snapshot, a guest that filled
--warm-fill MiB of tmpfs, each clone's first exec reading all of it (2 of
128 MiB in --quick, 4 of 384 MiB by default, 4 of 512 MiB in --full), with
the time of that read.

--booted-memory served sets the bench node's [memory] booted = "served": every
booted sandbox of the run (issue 21's "booted" rows among them) runs on RAM served
by pagefs instead of an owned tmpfs file. The rows keep their names; the report's
header says which it was, and the node's vm.dirty_* limits, which bound a served
guest's write speed (docs/performance.md).`,
		Example: `  cryoctl bench --quick
  cryoctl bench -o json > bench.json
  cryoctl bench --full --keep-log /tmp/bench-containerd.log
  cryoctl bench --full --only "issue 21"
  cryoctl bench --full --only "issue 21" --booted-memory served`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if quick && full {
				return errors.New("--quick and --full exclusive")
			}
			if err := checkBootedMemory(o.BootedMemory); err != nil {
				return err
			}
			preset := bench.Default()
			switch {
			case quick:
				preset = bench.Quick()
			case full:
				preset = bench.Full()
			}
			o.Sizes = overrideSizes(cmd, preset, sz)
			if o.Stack.BinDir == "" && os.Getenv("CRYO_BIN") == "" {
				// An installed cryoctl next to the shim needs no repository.
				if exe, err := os.Executable(); err == nil {
					if _, err := os.Stat(filepath.Join(filepath.Dir(exe), "containerd-shim-cryo-v2")); err == nil {
						o.Stack.BinDir = filepath.Dir(exe)
					}
				}
			}
			o.Progress = a.Stderr
			rep, err := bench.Run(cmd.Context(), o)
			if rep != nil {
				if perr := a.print(rep, rep.WriteText); perr != nil {
					err = errors.Join(err, perr)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "smallest sizes, one run per row (what the integration test runs)")
	f.BoolVar(&full, "full", false, "the targets' sizes: 1 GiB guests, 8 GiB disks, 8 clones, 20s warm-up")
	f.IntVar(&sz.Runs, "runs", sz.Runs, "samples per median")
	f.IntVar(&sz.GuestMiB, "guest-memory", sz.GuestMiB, "guest RAM (MiB) of the latency and fan-out rows")
	f.IntVar(&sz.SmallGuestMiB, "small-guest", sz.SmallGuestMiB, "small guest RAM (MiB) for the pause window")
	f.IntVar(&sz.LargeGuestMiB, "large-guest", sz.LargeGuestMiB, "large guest RAM (MiB): pause window, pipeline, incremental checkpoint, shim RSS")
	f.IntVar(&sz.SmallDiskMiB, "small-disk", sz.SmallDiskMiB, "small writable disk (MiB) for the pause window")
	f.IntVar(&sz.LargeDiskMiB, "large-disk", sz.LargeDiskMiB, "large writable disk (MiB) for the pause window")
	f.IntSliceVar(&sz.Clones, "clones", sz.Clones, "concurrent restores to measure; must start with 1")
	f.DurationVar(&sz.WarmUp, "warmup", sz.WarmUp, "warm-up of the expensive workload")
	f.IntVar(&sz.ChangePercent, "change-percent", sz.ChangePercent, "percent of guest RAM changed before the second checkpoint")
	f.StringVar(&o.Stack.BinDir, "bin", "", "directory with containerd-shim-cryo-v2 and cryoctl (default $CRYO_BIN, this binary's directory, <repo>/_output/bin)")
	f.StringVar(&o.Stack.GuestDir, "guest-dir", "", "guest image directory (default $CRYO_GUEST_DIR, <repo>/_output/guest)")
	f.StringVar(&o.Stack.Tools, "tools", "", "tools cache with bin/containerd, ctr, versitygw (default $CRYO_TOOLS, /var/cache/cryo/tools)")
	f.IntSliceVar(&sz.PauseRAMMiB, "pause-ram", sz.PauseRAMMiB, "RAM (MiB) the guest's writer keeps writing for the issue 21 pause rows, ascending (the VM is larger)")
	f.IntVar(&sz.PssClones, "pss-clones", sz.PssClones, "lazy clones whose summed QEMU Pss is compared with one clone's")
	f.IntVar(&sz.WarmClones, "warm-clones", sz.WarmClones, "lazy clones of the warm snapshot, each reading its fill, compared with one")
	f.IntVar(&sz.WarmFillMiB, "warm-fill", sz.WarmFillMiB, "MiB of tmpfs the warm snapshot's guest filled (its RAM: 2.5x)")
	f.IntVar(&sz.ChunkMiB, "chunk-size", 0, "snapshot chunk size in MiB (default: the config's, 1)")
	f.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the pipeline step (this process) to this file")
	f.StringVar(&o.KeepLog, "keep-log", "", "copy containerd's log (with the shims' restore steps) to this file")
	f.StringVar(&o.BootedMemory, "booted-memory", configs.BootedOwned, "how the bench node's booted sandboxes hold their RAM ([memory] booted): owned or served")
	f.StringVar(&o.Only, "only", "", "run only the steps whose name contains this (e.g. hibernation, \"issue 21\"), with only the targets of the steps that ran")
	return cmd
}

// checkBootedMemory refuses a --booted-memory the node config would refuse.
func checkBootedMemory(v string) error {
	if v != configs.BootedOwned && v != configs.BootedServed {
		return fmt.Errorf("--booted-memory %q: must be %s or %s", v, configs.BootedOwned, configs.BootedServed)
	}
	return nil
}

// overrideSizes takes the preset and replaces what was set by a flag.
func overrideSizes(cmd *cobra.Command, preset, flags bench.Sizes) bench.Sizes {
	ch := cmd.Flags().Changed
	set := func(name string, dst *int, v int) {
		if ch(name) {
			*dst = v
		}
	}
	set("runs", &preset.Runs, flags.Runs)
	set("guest-memory", &preset.GuestMiB, flags.GuestMiB)
	set("small-guest", &preset.SmallGuestMiB, flags.SmallGuestMiB)
	set("large-guest", &preset.LargeGuestMiB, flags.LargeGuestMiB)
	set("small-disk", &preset.SmallDiskMiB, flags.SmallDiskMiB)
	set("large-disk", &preset.LargeDiskMiB, flags.LargeDiskMiB)
	set("change-percent", &preset.ChangePercent, flags.ChangePercent)
	set("chunk-size", &preset.ChunkMiB, flags.ChunkMiB)
	set("pss-clones", &preset.PssClones, flags.PssClones)
	set("warm-clones", &preset.WarmClones, flags.WarmClones)
	set("warm-fill", &preset.WarmFillMiB, flags.WarmFillMiB)
	if ch("clones") {
		preset.Clones = flags.Clones
	}
	if ch("pause-ram") {
		preset.PauseRAMMiB = flags.PauseRAMMiB
	}
	if ch("warmup") {
		preset.WarmUp = flags.WarmUp
	}
	return preset
}
