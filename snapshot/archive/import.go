package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// ImportOptions say how an archive is checked.
type ImportOptions struct {
	// Read is the signature and encryption policy the snapshot must meet.
	Read snapshot.ReadOptions
	// TmpDir holds the temporary layout the archive is unpacked and
	// verified in (default: the system temp dir).
	TmpDir string
	// NoChecksum accepts an archive without a .sha256 file beside it (a
	// .sha256 that is there must still match).
	NoChecksum bool
	// Limits bound what the tar may hold (stores.ArchiveOptions' defaults
	// when zero).
	Limits   stores.ArchiveOptions
	Progress Progress // optional
}

// Imported is what Import published.
type Imported struct {
	Manifest digest.Digest `json:"manifest"`
	Signed   bool          `json:"signed"`
	// ChunksVerified says every chunk was decrypted and checked; without
	// the key of an encrypted snapshot only the digests are.
	ChunksVerified bool `json:"chunksVerified"`
}

// Import checks the archive at tarPath against the .sha256 file beside it,
// reads it (refusing unsafe entries) into a temporary layout, verifies the
// snapshot there (signature policy, every digest, every chunk when it can
// be decrypted), then publishes it to dst: blobs first, the signature, and
// tag last. A refused archive leaves dst's tags as they were.
func Import(ctx context.Context, tarPath string, dst stores.Store, tag string, opts ImportOptions) (Imported, error) {
	if tag == "" || strings.HasPrefix(tag, "sha256:") {
		return Imported{}, fmt.Errorf("import needs a tag to publish under, not %q: %w", tag, errdefs.ErrInvalidArgument)
	}
	want, err := readChecksum(tarPath + ".sha256")
	if err != nil && !(opts.NoChecksum && errors.Is(err, fs.ErrNotExist)) {
		return Imported{}, err
	}
	tmp, err := os.MkdirTemp(opts.TmpDir, "cryo-import-")
	if err != nil {
		return Imported{}, err
	}
	defer os.RemoveAll(tmp)
	staging, err := stores.NewFileStore(filepath.Join(tmp, "layout"))
	if err != nil {
		return Imported{}, err
	}
	snap, sigs, err := unpack(ctx, tarPath, want, staging, opts)
	if err != nil {
		return Imported{}, err
	}
	res, err := verify(ctx, staging, snap, opts.Read)
	if err != nil {
		return Imported{}, err
	}
	return res, publish(ctx, staging, dst, snap, sigs, tag)
}

// unpack reads the archive into staging, checks its sha256 against want
// (when there is one), and returns its snapshot manifest and signature
// manifests, the signatures tagged in staging for the reader to find.
func unpack(ctx context.Context, tarPath, want string, staging stores.Store, opts ImportOptions) (ocispec.Descriptor, []ocispec.Descriptor, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	h := sha256.New()
	r := io.TeeReader(countReader(bufio.NewReaderSize(f, 1<<20), st.Size(), opts.Progress), h)
	roots, err := stores.ReadArchive(ctx, r, staging, opts.Limits)
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	if _, err := io.Copy(io.Discard, r); err != nil { // the tar's trailer
		return ocispec.Descriptor{}, nil, err
	}
	if opts.Progress != nil {
		opts.Progress.Done()
	}
	if got := hex.EncodeToString(h.Sum(nil)); want != "" && got != want {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s has sha256 %s, %s says %s: %w", tarPath, got, filepath.Base(tarPath)+".sha256", want, errdefs.ErrDataLoss)
	}
	snap, sigs, err := splitRoots(roots)
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	for _, sd := range sigs {
		if sd.Annotations[ocispec.AnnotationRefName] != snapshot.SignatureTag(snap.Digest) {
			return ocispec.Descriptor{}, nil, fmt.Errorf("archive holds a signature for another manifest: %w", errdefs.ErrInvalidArgument)
		}
		if err := staging.Tag(ctx, sd, snapshot.SignatureTag(snap.Digest)); err != nil {
			return ocispec.Descriptor{}, nil, err
		}
	}
	return snap, sigs, nil
}

// verify opens the staged snapshot, which enforces the signature and
// encryption policy, and checks every chunk when it can: decrypting needs
// the key, without it the digests, checked on the way in, are all that can
// be verified.
func verify(ctx context.Context, staging stores.Store, snap ocispec.Descriptor, o snapshot.ReadOptions) (Imported, error) {
	s, err := snapshot.Open(ctx, staging, snap.Digest.String(), o)
	if err != nil {
		return Imported{}, err
	}
	res := Imported{Manifest: snap.Digest, Signed: s.Signed}
	if !s.Encrypted() || o.DecryptionKey != nil {
		if _, err := s.Verify(ctx); err != nil {
			return Imported{}, err
		}
		res.ChunksVerified = true
	}
	return res, nil
}

// publish copies the snapshot and its signatures from staging to dst, then
// tags them, the snapshot last.
func publish(ctx context.Context, staging, dst stores.Store, snap ocispec.Descriptor, sigs []ocispec.Descriptor, tag string) error {
	snap.Annotations = nil
	if err := stores.Copy(ctx, staging, dst, snap); err != nil {
		return err
	}
	for _, sd := range sigs {
		sd.Annotations = nil
		if err := stores.Copy(ctx, staging, dst, sd); err != nil {
			return err
		}
		if err := dst.Tag(ctx, sd, snapshot.SignatureTag(snap.Digest)); err != nil {
			return err
		}
	}
	return dst.Tag(ctx, snap, tag)
}

// splitRoots finds the one snapshot manifest and its signature manifests
// among the archive's index entries.
func splitRoots(roots []ocispec.Descriptor) (ocispec.Descriptor, []ocispec.Descriptor, error) {
	var snaps, sigs []ocispec.Descriptor
	for _, r := range roots {
		if snapshot.IsSignatureTag(r.Annotations[ocispec.AnnotationRefName]) {
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

// countReader starts p with total and counts what r reads; r itself when p
// is nil.
func countReader(r io.Reader, total int64, p Progress) io.Reader {
	if p == nil {
		return r
	}
	p.Start(total)
	return readerFunc(func(b []byte) (int, error) {
		n, err := r.Read(b)
		p.Add(int64(n))
		return n, err
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }
