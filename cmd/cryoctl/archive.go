package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cryo-runtime/cryo/snapshot/archive"
)

func newExportCommand(a *App) *cobra.Command {
	var opts archive.ExportOptions
	cmd := &cobra.Command{
		Use:   "export <store-url:tag|@digest> <dir>",
		Short: "Write a snapshot as <dir>/<namespace>/<id>/checkpoint.tar (oci-archive) with .sha256 and metadata.json",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.export(cmd.Context(), args[0], args[1], opts)
			if err != nil {
				return fmt.Errorf("export %s: %w", args[0], err)
			}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "exported %s to %s (sha256 %s)\n", args[0], res.Path, res.SHA256)
			})
		},
	}
	cmd.Flags().StringVar(&opts.Namespace, "namespace", "", "namespace directory (default: the source pod's namespace, else \"default\")")
	cmd.Flags().StringVar(&opts.ID, "id", "", "id directory (default: the source pod name, else sandbox id, else the manifest digest)")
	return cmd
}

func (a *App) export(ctx context.Context, url, dir string, opts archive.ExportOptions) (archive.Exported, error) {
	store, ref, err := a.openStore(ctx, url, true)
	if err != nil {
		return archive.Exported{}, err
	}
	if opts.Read, err = a.readOptions(); err != nil {
		return archive.Exported{}, err
	}
	opts.Progress = &archiveProgress{a: a, what: "export"}
	return archive.Export(ctx, store, ref, dir, opts)
}

func newImportCommand(a *App) *cobra.Command {
	var opts archive.ImportOptions
	cmd := &cobra.Command{
		Use:   "import <checkpoint.tar> <store-url:tag>",
		Short: "Verify an exported oci-archive and publish it to a store under a tag",
		Long: "import checks checkpoint.tar against checkpoint.tar.sha256 beside it, reads the archive\n" +
			"refusing unsafe entries, verifies the snapshot (signature policy, every digest, every\n" +
			"chunk when it can be decrypted) in a temporary layout, then publishes it: blobs first,\n" +
			"the tag last.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.importArchive(cmd.Context(), args[0], args[1], opts)
			if err != nil {
				return fmt.Errorf("import %s: %w", args[0], err)
			}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "imported %s as %s (%s, signed %v, chunks verified %v)\n", args[0], args[1], res.Manifest, res.Signed, res.ChunksVerified)
			})
		},
	}
	cmd.Flags().StringVar(&opts.TmpDir, "tmp-dir", "", "directory for the temporary layout (default: the system temp dir)")
	cmd.Flags().BoolVar(&opts.NoChecksum, "no-checksum", false, "accept an archive without a .sha256 file beside it")
	return cmd
}

// importResult is import's output: the store URL it published to, and
// what it published.
type importResult struct {
	Ref string `json:"ref"`
	archive.Imported
}

func (a *App) importArchive(ctx context.Context, tarPath, url string, opts archive.ImportOptions) (importResult, error) {
	dst, tag, err := a.openStore(ctx, url, true)
	if err != nil {
		return importResult{}, err
	}
	if opts.Read, err = a.readOptions(); err != nil {
		return importResult{}, err
	}
	opts.Progress = &archiveProgress{a: a, what: "import"}
	res, err := archive.Import(ctx, tarPath, dst, tag, opts)
	if err != nil {
		return importResult{}, err
	}
	return importResult{Ref: url, Imported: res}, nil
}

// archiveProgress shows an export's or import's bytes on the progress bar
// once the archive package knows their total.
type archiveProgress struct {
	a    *App
	what string
	p    *progress
}

func (x *archiveProgress) Start(total int64) { x.p = x.a.newProgress(total, x.what) }

func (x *archiveProgress) Add(n int64) { x.p.Add(n) }

func (x *archiveProgress) Done() { x.p.Done() }
