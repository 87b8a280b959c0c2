package stores

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// An oci-archive is a tar of an OCI image layout: oci-layout, index.json and
// blobs/sha256/<hex>. WriteArchive writes one from a store; ReadArchive
// reads one defensively, since it comes from outside the node.

// ArchiveOptions bound what ReadArchive accepts. Zero means the default in
// parentheses.
type ArchiveOptions struct {
	MaxEntries  int   // tar entries (1<<20)
	MaxBlobSize int64 // bytes of one blob (64 GiB)
	MaxPAXBytes int   // bytes of PAX records of one entry (64 KiB)
}

func (o *ArchiveOptions) defaults() {
	if o.MaxEntries <= 0 {
		o.MaxEntries = 1 << 20
	}
	if o.MaxBlobSize <= 0 {
		o.MaxBlobSize = 64 << 30
	}
	if o.MaxPAXBytes <= 0 {
		o.MaxPAXBytes = 64 << 10
	}
}

// WriteArchive writes to w an oci-archive holding roots (manifests, each
// with its org.opencontainers.image.ref.name annotation) and every blob they
// reach, read from src and verified on the way. index.json is written last.
func WriteArchive(ctx context.Context, w io.Writer, src Store, roots []ocispec.Descriptor) error {
	var all []ocispec.Descriptor
	seen := map[digest.Digest]bool{}
	for _, r := range roots {
		if err := Walk(ctx, src, r, func(d ocispec.Descriptor) error {
			if !seen[d.Digest] {
				seen[d.Digest] = true
				all = append(all, d)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	tw := tar.NewWriter(w)
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err := writeTarFile(tw, ocispec.ImageLayoutFile, layout); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	for _, d := range all {
		if err := writeTarBlob(ctx, tw, src, d); err != nil {
			return fmt.Errorf("write archive: blob %s: %w", d.Digest, err)
		}
	}
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: roots}
	ib, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	if err := writeTarFile(tw, ocispec.ImageIndexFile, ib); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return tw.Close()
}

func tarHeader(name string, size int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: size, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
}

func writeTarFile(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(tarHeader(name, int64(len(b)))); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

func writeTarBlob(ctx context.Context, tw *tar.Writer, src Store, d ocispec.Descriptor) error {
	rc, err := src.Fetch(ctx, d, 0, -1)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := tw.WriteHeader(tarHeader("blobs/"+d.Digest.Algorithm().String()+"/"+d.Digest.Encoded(), d.Size)); err != nil {
		return err
	}
	// A tar entry cannot be taken back: a bad blob fails the whole archive,
	// and the caller removes the partial file.
	_, err = CopyVerified(ctx, tw, rc, d)
	return err
}

// ReadArchive reads the oci-archive r, pushing every blob into dst (use a
// file store: blobs are pushed as plain blobs; Copy publishes them to any
// store afterwards), and returns the manifests its index.json lists, with
// their annotations. Nothing is tagged. It refuses absolute names, "..",
// names outside the layout, links, devices, FIFOs, duplicate names,
// oversized PAX headers and blobs that do not match their names, and checks
// that everything the manifests reach arrived.
func ReadArchive(ctx context.Context, r io.Reader, dst Store, opts ArchiveOptions) ([]ocispec.Descriptor, error) {
	opts.defaults()
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	var idx *ocispec.Index
	layoutOK := false
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read archive: entry %d: %w: %w", n, err, errdefs.ErrInvalidArgument)
		}
		if n >= opts.MaxEntries {
			return nil, fmt.Errorf("read archive: more than %d entries: %w", opts.MaxEntries, errdefs.ErrInvalidArgument)
		}
		name, err := archiveName(hdr, opts)
		if err != nil {
			return nil, fmt.Errorf("read archive: %w", err)
		}
		if seen[name] {
			return nil, fmt.Errorf("read archive: duplicate entry %q: %w", hdr.Name, errdefs.ErrInvalidArgument)
		}
		seen[name] = true
		switch {
		case hdr.Typeflag == tar.TypeDir:
		case name == ocispec.ImageLayoutFile:
			b, err := readLimited(tr, maxManifestSize)
			var l ocispec.ImageLayout
			if err != nil || json.Unmarshal(b, &l) != nil || l.Version != ocispec.ImageLayoutVersion {
				return nil, fmt.Errorf("read archive: bad oci-layout file: %w", errdefs.ErrInvalidArgument)
			}
			layoutOK = true
		case name == ocispec.ImageIndexFile:
			b, err := readLimited(tr, maxManifestSize)
			if err != nil {
				return nil, fmt.Errorf("read archive: index.json: %w", err)
			}
			idx = new(ocispec.Index)
			if err := json.Unmarshal(b, idx); err != nil {
				return nil, fmt.Errorf("read archive: index.json: %v: %w", err, errdefs.ErrInvalidArgument)
			}
		default: // a blob: archiveName checked the name
			d := digest.Digest("sha256:" + strings.TrimPrefix(name, "blobs/sha256/"))
			desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: d, Size: hdr.Size}
			if err := dst.Push(ctx, desc, io.LimitReader(tr, hdr.Size)); err != nil {
				return nil, fmt.Errorf("read archive: %s: %w", hdr.Name, err)
			}
		}
	}
	if !layoutOK || idx == nil {
		return nil, fmt.Errorf("read archive: not an oci-archive (oci-layout or index.json missing): %w", errdefs.ErrInvalidArgument)
	}
	for _, m := range idx.Manifests {
		if err := Walk(ctx, dst, m, func(d ocispec.Descriptor) error {
			ok, err := dst.Exists(ctx, d)
			if err == nil && !ok {
				err = fmt.Errorf("blob %s is not in the archive: %w", d.Digest, errdefs.ErrNotFound)
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("read archive: manifest %s: %w", m.Digest, err)
		}
	}
	return idx.Manifests, nil
}

// archiveName checks one tar header and returns its cleaned name.
func archiveName(hdr *tar.Header, opts ArchiveOptions) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("entry %q: %s: %w", hdr.Name, why, errdefs.ErrInvalidArgument)
	}
	pax := 0
	for k, v := range hdr.PAXRecords {
		pax += len(k) + len(v)
	}
	if pax > opts.MaxPAXBytes {
		return "", bad(fmt.Sprintf("PAX header of %d bytes (limit %d)", pax, opts.MaxPAXBytes))
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink, tar.TypeLink:
		return "", bad(fmt.Sprintf("links are not allowed (-> %q)", hdr.Linkname))
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return "", bad("devices and FIFOs are not allowed")
	default:
		return "", bad(fmt.Sprintf("entry type %q is not allowed", hdr.Typeflag))
	}
	name := hdr.Name
	if strings.HasPrefix(name, "/") {
		return "", bad("absolute path")
	}
	for _, e := range strings.Split(name, "/") {
		if e == ".." {
			return "", bad("path escapes the archive")
		}
	}
	name = strings.TrimPrefix(name, "./")
	if hdr.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
		switch name {
		case ".", "", "blobs", "blobs/sha256":
			return "dir:" + name, nil
		}
		return "", bad("unexpected directory")
	}
	if path.Clean(name) != name {
		return "", bad("path is not clean")
	}
	if name == ocispec.ImageLayoutFile || name == ocispec.ImageIndexFile {
		return name, nil
	}
	hexPart, ok := strings.CutPrefix(name, "blobs/sha256/")
	if !ok || digest.Digest("sha256:"+hexPart).Validate() != nil {
		return "", bad("not part of an OCI image layout")
	}
	if hdr.Size < 0 || hdr.Size > opts.MaxBlobSize {
		return "", bad(fmt.Sprintf("blob of %d bytes (limit %d)", hdr.Size, opts.MaxBlobSize))
	}
	return name, nil
}

// Copy copies root and everything it reaches from src to dst, children
// before parents, so dst never holds a manifest whose blobs are missing.
// Blobs dst already has are skipped. It does not tag.
func Copy(ctx context.Context, src, dst Store, root ocispec.Descriptor) error {
	var order []ocispec.Descriptor
	if err := Walk(ctx, src, root, func(d ocispec.Descriptor) error {
		order = append(order, d)
		return nil
	}); err != nil {
		return fmt.Errorf("copy %s: %w", root.Digest, err)
	}
	for i := len(order) - 1; i >= 0; i-- { // Walk visits parents first
		d := order[i]
		if ok, err := dst.Exists(ctx, d); err != nil {
			return fmt.Errorf("copy %s: %w", d.Digest, err)
		} else if ok {
			continue
		}
		if err := copyBlob(ctx, src, dst, d); err != nil {
			return fmt.Errorf("copy %s: %w", d.Digest, err)
		}
	}
	return nil
}

func copyBlob(ctx context.Context, src, dst Store, d ocispec.Descriptor) error {
	rc, err := src.Fetch(ctx, d, 0, -1)
	if err != nil {
		return err
	}
	defer rc.Close()
	// Verified on the way: a store that lies is caught before dst keeps it.
	vr := &verifyingReader{r: rc, v: d.Digest.Verifier(), want: d.Size, d: d.Digest}
	return dst.Push(ctx, d, vr)
}

// verifyingReader returns an error instead of io.EOF when the stream does
// not match its digest and size.
type verifyingReader struct {
	r    io.Reader
	v    digest.Verifier
	n    int64
	want int64
	d    digest.Digest
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.v.Write(p[:n])
	v.n += int64(n)
	if v.n > v.want {
		return n, fmt.Errorf("blob %s: more than %d bytes: %w: %w", v.d, v.want, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	if errors.Is(err, io.EOF) && (v.n != v.want || !v.v.Verified()) {
		return n, fmt.Errorf("blob %s: %w: %w", v.d, ErrDigestMismatch, errdefs.ErrDataLoss)
	}
	return n, err
}
