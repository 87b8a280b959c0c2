// Command cryoctl is cryo's node CLI: it inspects, verifies, moves and
// garbage-collects snapshots and their stores, and warms the node cache.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cryo-runtime/cryo/bench"
)

func main() {
	// The bench copies this binary into its guest image as the memory
	// writer (a static binary the guest can run without a libc).
	if filepath.Base(os.Args[0]) == bench.MemWriterName {
		os.Exit(bench.MemWriter(os.Args[1:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(&App{Stdout: os.Stdout, Stderr: os.Stderr}).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cryoctl:", err)
		os.Exit(1)
	}
}

// newRootCommand builds the command tree. Add subcommands here.
func newRootCommand(a *App) *cobra.Command {
	root := &cobra.Command{
		Use:           "cryoctl",
		Short:         "Manage cryo snapshots, stores and the node cache",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return a.load(cmd)
		},
	}
	root.SetOut(a.Stdout)
	root.SetErr(a.Stderr)
	a.addGlobalFlags(root.PersistentFlags())
	root.AddCommand(
		// store layer (cmd/cryoctl/store.go, snapshot.go, archive.go)
		newInspectCommand(a),
		newVerifyCommand(a),
		newLsCommand(a),
		newRmCommand(a),
		newGCCommand(a),
		newPullCommand(a),
		newExportCommand(a),
		newImportCommand(a),
		// sandbox commands (cmd/cryoctl/checkpoint.go)
		newCheckpointCommand(a),
		newBenchCommand(a),
	)
	return root
}
