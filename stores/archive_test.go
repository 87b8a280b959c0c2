package stores_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// archiveOf writes fixture f as an oci-archive and returns the tar bytes.
func archiveOf(t *testing.T, f storetest.Fixture) []byte {
	t.Helper()
	src, _ := openT(t, "file://"+t.TempDir()+"/src")
	storetest.Seed(t, src, f)
	root, err := src.Resolve(context.Background(), f.Tag)
	if err != nil {
		t.Fatal(err)
	}
	root.Annotations = map[string]string{ocispec.AnnotationRefName: f.Tag}
	var buf bytes.Buffer
	if err := stores.WriteArchive(context.Background(), &buf, src, []ocispec.Descriptor{root}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestArchiveRoundTrip(t *testing.T) {
	f := storetest.NewFixture("v1", 4)
	b := archiveOf(t, f)
	tmp, _ := openT(t, "file://"+t.TempDir()+"/tmp")
	roots, err := stores.ReadArchive(context.Background(), bytes.NewReader(b), tmp, stores.ArchiveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(roots) != 1 || roots[0].Digest != f.Manifest.Desc.Digest || roots[0].Annotations[ocispec.AnnotationRefName] != "v1" {
		t.Fatalf("roots = %+v", roots)
	}
	dst, _ := openT(t, "file://"+t.TempDir()+"/dst")
	if err := stores.Copy(context.Background(), tmp, dst, roots[0]); err != nil {
		t.Fatal(err)
	}
	if err := dst.Tag(context.Background(), roots[0], "v1"); err != nil {
		t.Fatal(err)
	}
	storetest.CheckRead(t, dst, f)
}

// entry is one tar entry of a hand-made archive.
type entry struct {
	hdr  tar.Header
	data []byte
}

func reg(name string, data []byte) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}, data}
}

// entriesOf splits an archive into entries so tests can tamper with them.
func entriesOf(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var data bytes.Buffer
		data.ReadFrom(tr)
		h.PAXRecords = nil
		h.Format = tar.FormatUnknown
		out = append(out, entry{*h, data.Bytes()})
	}
	return out
}

func tarOf(t *testing.T, es []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.hdr
		start := buf.Len()
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write %s: %v", h.Name, err)
		}
		tw.Flush()
		if h.Name == "PaxHeaders/x" { // turn it into a PAX extended header
			blk := buf.Bytes()[start : start+512]
			blk[156] = tar.TypeXHeader
			copy(blk[148:156], "        ")
			sum := 0
			for _, c := range blk {
				sum += int(c)
			}
			copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
		}
		tw.Write(e.data)
	}
	tw.Close()
	return buf.Bytes()
}

// paxLen returns the length prefix of a PAX record ("<len> " counting itself).
func paxLen(rec string) string {
	n := len(rec) + 1
	for {
		p := fmt.Sprintf("%d ", n)
		if len(p)+len(rec) == n {
			return p
		}
		n = len(p) + len(rec)
	}
}

func TestArchiveHostile(t *testing.T) {
	f := storetest.NewFixture("v1", 5)
	good := entriesOf(t, archiveOf(t, f))
	// Put extra entries first so they are met before the layout is complete.
	with := func(extra ...entry) []entry { return append(extra, good...) }
	blobIdx := -1
	for i, e := range good {
		if strings.HasSuffix(e.hdr.Name, f.Layers[1].Desc.Digest.Encoded()) {
			blobIdx = i
		}
	}
	flipped := append([]entry(nil), good...)
	flipped[blobIdx].data = bytes.Clone(flipped[blobIdx].data)
	flipped[blobIdx].data[7] ^= 1
	missing := append(append([]entry(nil), good[:blobIdx]...), good[blobIdx+1:]...)
	truncated := append([]entry(nil), good...)
	truncated[blobIdx].data = truncated[blobIdx].data[:100]
	truncated[blobIdx].hdr.Size = 100
	dup := append(append([]entry(nil), good...), good[blobIdx])
	hugePAX := reg("oci-layout-note", nil)
	hugePAX.hdr.PAXRecords = map[string]string{"comment": strings.Repeat("x", 100<<10)}
	hugePAX.hdr.Name = "blobs/sha256/" + f.Layers[1].Desc.Digest.Encoded()
	// A raw 2 MiB PAX header: archive/tar will not write one itself.
	rec := strings.Repeat("x", 2<<20)
	rec = "comment=" + rec + "\n"
	rec = paxLen(rec) + rec
	giantPAX := reg("PaxHeaders/x", []byte(rec))
	giantPAX.hdr.Format = tar.FormatUSTAR

	for _, tc := range []struct {
		name    string
		entries []entry
		want    string
	}{
		{"dotdot", with(reg("../evil", []byte("x"))), "escapes"},
		{"dotdot-inside", with(reg("blobs/../../evil", []byte("x"))), "escapes"},
		{"absolute", with(reg("/etc/evil", []byte("x"))), "absolute"},
		{"symlink", with(entry{tar.Header{Name: "blobs/sha256/" + strings.Repeat("a", 64), Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}, nil}), "links are not allowed"},
		{"hardlink", with(entry{tar.Header{Name: "index2", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}, nil}), "links are not allowed"},
		{"chardev", with(entry{tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, nil}), "devices"},
		{"blockdev", with(entry{tar.Header{Name: "sda", Typeflag: tar.TypeBlock}, nil}), "devices"},
		{"fifo", with(entry{tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}, nil}), "FIFOs"},
		{"duplicate", dup, "duplicate"},
		{"duplicate-dot-slash", with(reg("./oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))), "duplicate"},
		{"stray-file", with(reg("evil.sh", []byte("x"))), "not part of an OCI image layout"},
		{"bad-blob-name", with(reg("blobs/sha256/../../x", []byte("x"))), "escapes"},
		{"huge-pax", with(hugePAX), "PAX header"},
		{"giant-pax", with(giantPAX), "too long"},
		{"flipped-bit", flipped, "does not match"},
		{"truncated-blob", truncated, "does not match"},
		{"missing-blob", missing, "not in the archive"},
		{"no-index", good[:len(good)-1], "not an oci-archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dst, err := stores.NewFileStore(filepath.Join(root, "layout"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = stores.ReadArchive(context.Background(), bytes.NewReader(tarOf(t, tc.entries)), dst, stores.ArchiveOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if !errdefs.IsInvalidArgument(err) && !errdefs.IsDataLoss(err) && !errdefs.IsNotFound(err) {
				t.Errorf("err %v is not invalid argument, data loss or not found", err)
			}
			// Nothing is written outside the destination layout.
			ents, _ := os.ReadDir(root)
			if len(ents) != 1 {
				t.Fatalf("files beside the layout: %v", ents)
			}
			if tags, _ := dst.Tags(context.Background()); len(tags) != 0 {
				t.Fatalf("a refused archive left tags %v", tags)
			}
		})
	}
}

func TestArchiveLayoutJSON(t *testing.T) {
	es := entriesOf(t, archiveOf(t, storetest.NewFixture("v1", 6)))
	if es[0].hdr.Name != "oci-layout" || es[len(es)-1].hdr.Name != "index.json" {
		t.Fatalf("entry order %s ... %s, want oci-layout first and index.json last", es[0].hdr.Name, es[len(es)-1].hdr.Name)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(es[len(es)-1].data, &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index = %+v, %v", idx, err)
	}
}
