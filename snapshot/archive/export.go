// Package archive moves a snapshot between stores through a single file: an
// export directory holding an oci-archive of the snapshot (and its
// signature), its checksum and its metadata, which an operator can copy
// anywhere; an import reads such a file back, as untrusted input, into a
// store. The tar format itself is stores.WriteArchive and ReadArchive.
//
// The layout of an export:
//
//	<dir>/<namespace>/<id>/checkpoint.tar         oci-archive of the snapshot (+ signature)
//	<dir>/<namespace>/<id>/checkpoint.tar.sha256  "<hex>  checkpoint.tar"
//	<dir>/<namespace>/<id>/metadata.json          Metadata
package archive

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// File names in an export directory.
const (
	ArchiveName  = "checkpoint.tar"
	ChecksumName = ArchiveName + ".sha256"
	MetadataName = "metadata.json"
)

// Metadata is metadata.json: what the archive holds, readable without
// opening it.
type Metadata struct {
	Manifest digest.Digest     `json:"manifest"`
	Tag      string            `json:"tag,omitempty"`
	Signed   bool              `json:"signed"`
	SHA256   string            `json:"archiveSHA256"`
	Size     int64             `json:"archiveSize"`
	Snapshot snapshot.Metadata `json:"snapshot"`
}

// Progress is told a transfer's size once it is known, counts its bytes,
// and is told when it is done (cryoctl's progress bar).
type Progress interface {
	Start(total int64)
	Add(n int64)
	Done()
}

// ExportOptions say where in the export directory the snapshot goes and how
// it is read.
type ExportOptions struct {
	// Namespace and ID name the directories; empty means the source pod's
	// namespace (else "default") and its pod name (else sandbox id, else
	// the manifest digest's first 12 hex digits).
	Namespace, ID string
	Read          snapshot.ReadOptions
	Progress      Progress // optional
}

// Exported is what Export wrote.
type Exported struct {
	Path     string        `json:"path"`
	SHA256   string        `json:"sha256"`
	Size     int64         `json:"size"`
	Manifest digest.Digest `json:"manifest"`
}

var pathElemRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// Export writes the snapshot ref of store, and its signature when the
// store has one, under dir. The checksum file is written last: its presence
// says the export is complete.
func Export(ctx context.Context, store stores.Store, ref, dir string, opts ExportOptions) (Exported, error) {
	s, err := snapshot.Open(ctx, store, ref, opts.Read)
	if err != nil {
		return Exported{}, err
	}
	out, err := exportDir(dir, s, opts)
	if err != nil {
		return Exported{}, err
	}
	tag := ref
	if strings.HasPrefix(ref, "sha256:") {
		tag = "snapshot"
	}
	roots, err := exportRoots(ctx, store, s.Descriptor, tag)
	if err != nil {
		return Exported{}, err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return Exported{}, err
	}
	res, err := writeArchive(ctx, store, roots, out, s.Metadata.Totals.StoredBytes, opts.Progress)
	if err != nil {
		return Exported{}, err
	}
	md := Metadata{Manifest: res.Manifest, Tag: tag, Signed: s.Signed, SHA256: res.SHA256, Size: res.Size, Snapshot: s.Metadata}
	mb, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return res, err
	}
	if err := atomicfile.Write(filepath.Join(out, MetadataName), append(mb, '\n'), 0o600); err != nil {
		return res, err
	}
	return res, atomicfile.Write(filepath.Join(out, ChecksumName), []byte(res.SHA256+"  "+ArchiveName+"\n"), 0o600)
}

// exportDir is dir/<namespace>/<id>, each a safe single path element.
func exportDir(dir string, s *snapshot.Snapshot, opts ExportOptions) (string, error) {
	src := s.Metadata.Source
	ns := cmp.Or(opts.Namespace, src.Namespace, "default")
	id := cmp.Or(opts.ID, src.PodName, src.SandboxID, s.Descriptor.Digest.Encoded()[:12])
	for _, e := range []string{ns, id} {
		if !pathElemRE.MatchString(e) {
			return "", fmt.Errorf("%q is not a safe directory name: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	return filepath.Join(dir, ns, id), nil
}

// exportRoots are the archive's index entries: the snapshot's manifest
// under tag, and its signature manifest when the store has one.
func exportRoots(ctx context.Context, store stores.Store, snap ocispec.Descriptor, tag string) ([]ocispec.Descriptor, error) {
	root := snap
	root.MediaType, root.ArtifactType = ocispec.MediaTypeImageManifest, snapshot.ArtifactType
	root.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
	roots := []ocispec.Descriptor{root}
	sigTag := snapshot.SignatureTag(root.Digest)
	sd, err := store.Resolve(ctx, sigTag)
	switch {
	case err == nil:
		sd.Annotations = map[string]string{ocispec.AnnotationRefName: sigTag}
		roots = append(roots, sd)
	case !errdefs.IsNotFound(err):
		return nil, err
	}
	return roots, nil
}

// writeArchive writes out/checkpoint.tar through a temporary file, so that
// a failed export leaves no partial archive under the final name.
func writeArchive(ctx context.Context, store stores.Store, roots []ocispec.Descriptor, out string, total int64, p Progress) (res Exported, retErr error) {
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
	bw := bufio.NewWriterSize(io.MultiWriter(tmp, h), 1<<20)
	if err := stores.WriteArchive(ctx, countWriter(bw, total, p), store, roots); err != nil {
		return res, err
	}
	if p != nil {
		p.Done()
	}
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
	res = Exported{Path: filepath.Join(out, ArchiveName), SHA256: hex.EncodeToString(h.Sum(nil)), Size: st.Size(), Manifest: roots[0].Digest}
	return res, os.Rename(tmp.Name(), res.Path)
}

// countWriter starts p with total and counts what w writes; w itself when
// p is nil.
func countWriter(w io.Writer, total int64, p Progress) io.Writer {
	if p == nil {
		return w
	}
	p.Start(total)
	return io.MultiWriter(w, writerFunc(func(b []byte) (int, error) { p.Add(int64(len(b))); return len(b), nil }))
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
