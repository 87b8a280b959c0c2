package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"

	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// The single-file export layout of the seed documents:
//
//	<dir>/<namespace>/<id>/checkpoint.tar         oci-archive of the snapshot (+ signature)
//	<dir>/<namespace>/<id>/checkpoint.tar.sha256  "<hex>  checkpoint.tar"
//	<dir>/<namespace>/<id>/metadata.json          exportMetadata
const (
	archiveName  = "checkpoint.tar"
	checksumName = archiveName + ".sha256"
	metadataName = "metadata.json"
)

// exportMetadata is metadata.json.
type exportMetadata struct {
	Manifest digest.Digest     `json:"manifest"`
	Tag      string            `json:"tag,omitempty"`
	Signed   bool              `json:"signed"`
	SHA256   string            `json:"archiveSHA256"`
	Size     int64             `json:"archiveSize"`
	Snapshot snapshot.Metadata `json:"snapshot"`
}

var pathElemRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

func newExportCommand(a *App) *cobra.Command {
	var ns, id string
	cmd := &cobra.Command{
		Use:   "export <store-url:tag|@digest> <dir>",
		Short: "Write a snapshot as <dir>/<namespace>/<id>/checkpoint.tar (oci-archive) with .sha256 and metadata.json",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.export(cmd.Context(), args[0], args[1], ns, id)
			if err != nil {
				return fmt.Errorf("export %s: %w", args[0], err)
			}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "exported %s to %s (sha256 %s)\n", args[0], res.Path, res.SHA256)
			})
		},
	}
	cmd.Flags().StringVar(&ns, "namespace", "", "namespace directory (default: the source pod's namespace, else \"default\")")
	cmd.Flags().StringVar(&id, "id", "", "id directory (default: the source pod name, else sandbox id, else the manifest digest)")
	return cmd
}

type exportResult struct {
	Path     string        `json:"path"`
	SHA256   string        `json:"sha256"`
	Size     int64         `json:"size"`
	Manifest digest.Digest `json:"manifest"`
}

func (a *App) export(ctx context.Context, url, dir, ns, id string) (res exportResult, retErr error) {
	store, ref, err := a.openStore(ctx, url, true)
	if err != nil {
		return res, err
	}
	o, err := a.readOptions()
	if err != nil {
		return res, err
	}
	s, err := snapshot.Open(ctx, store, ref, o)
	if err != nil {
		return res, err
	}
	md := s.Metadata
	ns = firstNonEmpty(ns, md.Source.Namespace, "default")
	id = firstNonEmpty(id, md.Source.PodName, md.Source.SandboxID, s.Descriptor.Digest.Encoded()[:12])
	for _, e := range []string{ns, id} {
		if !pathElemRE.MatchString(e) {
			return res, fmt.Errorf("%q is not a safe directory name: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	tag := ref
	if strings.HasPrefix(ref, "sha256:") {
		tag = "snapshot"
	}
	root := s.Descriptor
	root.MediaType, root.ArtifactType = ocispec.MediaTypeImageManifest, snapshot.ArtifactType
	root.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
	roots := []ocispec.Descriptor{root}
	sigTag := snapshot.SignatureTag(root.Digest)
	if sd, err := store.Resolve(ctx, sigTag); err == nil {
		sd.Annotations = map[string]string{ocispec.AnnotationRefName: sigTag}
		roots = append(roots, sd)
	} else if !errdefs.IsNotFound(err) {
		return res, err
	}

	out := filepath.Join(dir, ns, id)
	if err := os.MkdirAll(out, 0o700); err != nil {
		return res, err
	}
	tmp, err := os.CreateTemp(out, ".checkpoint.tar-*")
	if err != nil {
		return res, err
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return res, err
	}
	h := sha256.New()
	bar := a.newProgress(md.Totals.StoredBytes, "export")
	bw := bufio.NewWriterSize(io.MultiWriter(tmp, h), 1<<20)
	if err := stores.WriteArchive(ctx, bar.Writer(bw), store, roots); err != nil {
		return res, err
	}
	bar.Done()
	if err := bw.Flush(); err != nil {
		return res, err
	}
	if err := tmp.Sync(); err != nil {
		return res, err
	}
	st, err := tmp.Stat()
	if err != nil {
		return res, err
	}
	if err := tmp.Close(); err != nil {
		return res, err
	}
	res = exportResult{Path: filepath.Join(out, archiveName), SHA256: hex.EncodeToString(h.Sum(nil)), Size: st.Size(), Manifest: root.Digest}
	if err := os.Rename(tmp.Name(), res.Path); err != nil {
		return res, err
	}
	mb, err := json.MarshalIndent(exportMetadata{Manifest: root.Digest, Tag: tag, Signed: s.Signed, SHA256: res.SHA256, Size: res.Size, Snapshot: md}, "", "  ")
	if err != nil {
		return res, err
	}
	if err := atomicfile.Write(filepath.Join(out, metadataName), append(mb, '\n'), 0o600); err != nil {
		return res, err
	}
	// The checksum goes last: its presence says the export is complete.
	return res, atomicfile.Write(filepath.Join(out, checksumName), []byte(res.SHA256+"  "+archiveName+"\n"), 0o600)
}

func newImportCommand(a *App) *cobra.Command {
	var tmpDir string
	var noChecksum bool
	cmd := &cobra.Command{
		Use:   "import <checkpoint.tar> <store-url:tag>",
		Short: "Verify an exported oci-archive and publish it to a store under a tag",
		Long: "import checks checkpoint.tar against checkpoint.tar.sha256 beside it, reads the archive\n" +
			"refusing unsafe entries, verifies the snapshot (signature policy, every digest, every\n" +
			"chunk when it can be decrypted) in a temporary layout, then publishes it: blobs first,\n" +
			"the tag last.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.importArchive(cmd.Context(), args[0], args[1], tmpDir, noChecksum)
			if err != nil {
				return fmt.Errorf("import %s: %w", args[0], err)
			}
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "imported %s as %s (%s, signed %v, chunks verified %v)\n", args[0], args[1], res.Manifest, res.Signed, res.ChunksVerified)
			})
		},
	}
	cmd.Flags().StringVar(&tmpDir, "tmp-dir", "", "directory for the temporary layout (default: the system temp dir)")
	cmd.Flags().BoolVar(&noChecksum, "no-checksum", false, "accept an archive without a .sha256 file beside it")
	return cmd
}

type importResult struct {
	Ref            string        `json:"ref"`
	Manifest       digest.Digest `json:"manifest"`
	Signed         bool          `json:"signed"`
	ChunksVerified bool          `json:"chunksVerified"`
}

func (a *App) importArchive(ctx context.Context, tarPath, url, tmpDir string, noChecksum bool) (importResult, error) {
	var res importResult
	dst, tag, err := a.openStore(ctx, url, true)
	if err != nil {
		return res, err
	}
	if strings.HasPrefix(tag, "sha256:") {
		return res, fmt.Errorf("import needs a tag to publish under, not a digest: %w", errdefs.ErrInvalidArgument)
	}
	o, err := a.readOptions()
	if err != nil {
		return res, err
	}
	want, err := readChecksum(tarPath + ".sha256")
	if err != nil && !(noChecksum && errors.Is(err, fs.ErrNotExist)) {
		return res, err
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return res, err
	}
	defer f.Close()
	tmp, err := os.MkdirTemp(tmpDir, "cryoctl-import-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	staging, err := stores.NewFileStore(filepath.Join(tmp, "layout"))
	if err != nil {
		return res, err
	}
	st, _ := f.Stat()
	bar := a.newProgress(st.Size(), "import")
	h := sha256.New()
	r := io.TeeReader(bar.Reader(bufio.NewReaderSize(f, 1<<20)), h)
	roots, err := stores.ReadArchive(ctx, r, staging, stores.ArchiveOptions{})
	if err != nil {
		return res, err
	}
	if _, err := io.Copy(io.Discard, r); err != nil { // the tar's trailer
		return res, err
	}
	bar.Done()
	if got := hex.EncodeToString(h.Sum(nil)); want != "" && got != want {
		return res, fmt.Errorf("%s has sha256 %s, %s says %s: %w", tarPath, got, filepath.Base(tarPath)+".sha256", want, errdefs.ErrDataLoss)
	}
	snap, sigs, err := splitRoots(roots)
	if err != nil {
		return res, err
	}
	for _, sd := range sigs {
		if sd.Annotations[ocispec.AnnotationRefName] != snapshot.SignatureTag(snap.Digest) {
			return res, fmt.Errorf("archive holds a signature for another manifest: %w", errdefs.ErrInvalidArgument)
		}
		if err := staging.Tag(ctx, sd, snapshot.SignatureTag(snap.Digest)); err != nil {
			return res, err
		}
	}
	// The reader enforces the signature and encryption policy; Verify checks
	// every chunk (decrypting needs the key: without it the digests, checked
	// on the way in, are all that can be verified).
	s, err := snapshot.Open(ctx, staging, snap.Digest.String(), o)
	if err != nil {
		return res, err
	}
	if !s.Encrypted() || o.DecryptionKey != nil {
		if _, err := s.Verify(ctx); err != nil {
			return res, err
		}
		res.ChunksVerified = true
	}
	snap.Annotations = nil
	if err := stores.Copy(ctx, staging, dst, snap); err != nil {
		return res, err
	}
	for _, sd := range sigs {
		sd.Annotations = nil
		if err := stores.Copy(ctx, staging, dst, sd); err != nil {
			return res, err
		}
		if err := dst.Tag(ctx, sd, snapshot.SignatureTag(snap.Digest)); err != nil {
			return res, err
		}
	}
	if err := dst.Tag(ctx, snap, tag); err != nil {
		return res, err
	}
	return importResult{Ref: url, Manifest: snap.Digest, Signed: s.Signed, ChunksVerified: res.ChunksVerified}, nil
}

// splitRoots finds the one snapshot manifest and its signature manifests
// among the archive's index entries.
func splitRoots(roots []ocispec.Descriptor) (ocispec.Descriptor, []ocispec.Descriptor, error) {
	var snaps, sigs []ocispec.Descriptor
	for _, r := range roots {
		if isSignatureTag(r.Annotations[ocispec.AnnotationRefName]) {
			sigs = append(sigs, r)
		} else {
			snaps = append(snaps, r)
		}
	}
	if len(snaps) != 1 {
		return ocispec.Descriptor{}, nil, fmt.Errorf("archive holds %d snapshots, want 1: %w", len(snaps), errdefs.ErrInvalidArgument)
	}
	return snaps[0], sigs, nil
}

// readChecksum reads "<hex>  name" from a .sha256 file.
func readChecksum(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 || len(fields[0]) != 64 {
		return "", fmt.Errorf("%s: not a sha256 checksum file: %w", path, errdefs.ErrInvalidArgument)
	}
	if _, err := hex.DecodeString(fields[0]); err != nil {
		return "", fmt.Errorf("%s: not a sha256 checksum file: %w", path, errdefs.ErrInvalidArgument)
	}
	return strings.ToLower(fields[0]), nil
}
