package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

func newStore(t *testing.T) stores.Store {
	t.Helper()
	s, err := stores.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeSnapshot writes a small signed snapshot (two files, 1 MiB chunks,
// some of them zero) to a new store under tag v1.
func writeSnapshot(t *testing.T, key ed25519.PrivateKey) (stores.Store, ocispec.Descriptor) {
	t.Helper()
	ram := make([]byte, 3<<20)
	for i := range len(ram) / 2 {
		ram[i] = byte(i * 7)
	}
	src := &snapshot.Source{
		Metadata: snapshot.Metadata{
			Source: snapshot.SourceInfo{SandboxID: "sb-1", PodName: "web-0", Namespace: "team"},
			Fingerprint: fingerprint.Fingerprint{QEMUVersion: "7.2.0", MachineType: "pc-q35-7.2", CPUModel: "qemu64",
				MemoryMiB: 3, VCPUs: 1, Accel: "tcg"},
		},
		Files: []snapshot.SourceFile{
			snapshot.BytesSourceFile(snapshot.FileRAM, ram),
			snapshot.BytesSourceFile(snapshot.FileDevState, []byte("device state")),
		},
	}
	store := newStore(t)
	d, _, err := snapshot.Write(context.Background(), store, "v1", src, snapshot.WriteOptions{ChunkSize: 1 << 20, SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return store, d
}

func newKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// countingProgress records what Export and Import report.
type countingProgress struct {
	total, n int64
	done     bool
}

func (p *countingProgress) Start(total int64) { p.total = total }
func (p *countingProgress) Add(n int64)       { p.n += n }
func (p *countingProgress) Done()             { p.done = true }

func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	pub, priv := newKey(t)
	src, d := writeSnapshot(t, priv)
	dir := t.TempDir()
	var ep countingProgress
	res, err := Export(ctx, src, "v1", dir, ExportOptions{Read: snapshot.ReadOptions{PublicKey: pub}, Progress: &ep})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "team", "web-0")
	if res.Path != filepath.Join(out, ArchiveName) || res.Manifest != d.Digest {
		t.Fatalf("Export = %+v, want %s of %s", res, filepath.Join(out, ArchiveName), d.Digest)
	}
	for _, f := range []string{ArchiveName, ChecksumName, MetadataName} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out, ".checkpoint.tar-*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	b, err := os.ReadFile(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if cs, _ := os.ReadFile(filepath.Join(out, ChecksumName)); string(cs) != hex.EncodeToString(sum[:])+"  checkpoint.tar\n" || res.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("checksum file %q, result %s, archive hashes to %x", cs, res.SHA256, sum)
	}
	var md Metadata
	if mb, _ := os.ReadFile(filepath.Join(out, MetadataName)); json.Unmarshal(mb, &md) != nil || md.Manifest != d.Digest || !md.Signed || md.Tag != "v1" || md.Size != int64(len(b)) {
		t.Fatalf("metadata.json = %+v", md)
	}
	if ep.n != int64(len(b)) || !ep.done || ep.total <= 0 {
		t.Fatalf("export progress %+v, archive of %d bytes", ep, len(b))
	}

	dst := newStore(t)
	tmp := t.TempDir()
	var ip countingProgress
	ir, err := Import(ctx, res.Path, dst, "restored", ImportOptions{
		Read: snapshot.ReadOptions{PublicKey: pub, RequireSignature: true}, TmpDir: tmp, Progress: &ip})
	if err != nil {
		t.Fatal(err)
	}
	if ir.Manifest != d.Digest || !ir.Signed || !ir.ChunksVerified {
		t.Fatalf("Import = %+v", ir)
	}
	if ip.n != int64(len(b)) || ip.total != int64(len(b)) || !ip.done {
		t.Fatalf("import progress %+v, archive of %d bytes", ip, len(b))
	}
	s, err := snapshot.Open(ctx, dst, "restored", snapshot.ReadOptions{PublicKey: pub, RequireSignature: true})
	if err != nil {
		t.Fatalf("the imported snapshot: %v", err)
	}
	if _, err := s.Verify(ctx); err != nil || s.Descriptor.Digest != d.Digest {
		t.Fatalf("verify the imported snapshot %s: %v", s.Descriptor.Digest, err)
	}
	assertEmpty(t, tmp)
}

func TestExportRefusesUnsafeDirectoryNames(t *testing.T) {
	_, priv := newKey(t)
	src, _ := writeSnapshot(t, priv)
	dir := t.TempDir()
	for _, o := range []ExportOptions{{Namespace: ".."}, {ID: "../x"}, {ID: "a/b"}, {Namespace: ".hidden"}} {
		if _, err := Export(context.Background(), src, "v1", dir, o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Export %+v: %v, want invalid argument", o, err)
		}
	}
	assertEmpty(t, dir)
}

func TestImportNeedsATag(t *testing.T) {
	for _, tag := range []string{"", "sha256:" + strings.Repeat("0", 64)} {
		if _, err := Import(context.Background(), "/nonexistent", newStore(t), tag, ImportOptions{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Import under %q: %v, want invalid argument", tag, err)
		}
	}
}

type entry struct {
	hdr  tar.Header
	data []byte
}

// exportEntries exports a signed snapshot and returns its archive's entries.
func exportEntries(t *testing.T) []entry {
	t.Helper()
	_, priv := newKey(t)
	src, _ := writeSnapshot(t, priv)
	res, err := Export(context.Background(), src, "v1", t.TempDir(), ExportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var es []entry
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return es
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, entry{*hdr, b})
	}
}

// writeTar writes es as dir/checkpoint.tar with a matching .sha256, so
// that only the archive's content can be what Import refuses.
func writeTar(t *testing.T, es []entry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		hdr := e.hdr
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), ArchiveName)
	sum := sha256.Sum256(buf.Bytes())
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".sha256", []byte(hex.EncodeToString(sum[:])+"  "+ArchiveName+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func reg(name string, data []byte) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(data)), Format: tar.FormatPAX}, data}
}

// firstBlob is the index of es's first blob entry.
func firstBlob(t *testing.T, es []entry) int {
	for i, e := range es {
		if strings.HasPrefix(e.hdr.Name, "blobs/sha256/") {
			return i
		}
	}
	t.Fatal("no blob in the archive")
	return -1
}

// TestImportRefusesHostileArchives: an archive comes from outside the node.
// Each one here is refused as invalid, publishes nothing, writes nothing
// outside the temporary layout, and leaves no temporary files.
func TestImportRefusesHostileArchives(t *testing.T) {
	es := exportEntries(t)
	if _, err := Import(context.Background(), writeTar(t, es), newStore(t), "ok", ImportOptions{}); err != nil {
		t.Fatalf("the unaltered entries: %v", err)
	}
	b := firstBlob(t, es)
	blob := es[b]
	with := func(extra ...entry) []entry { return append(append([]entry(nil), extra...), es...) }
	replaced := func(e entry) []entry {
		out := append([]entry(nil), es...)
		out[b] = e
		return out
	}
	symlink := blob
	symlink.hdr.Typeflag, symlink.hdr.Linkname, symlink.hdr.Size, symlink.data = tar.TypeSymlink, "/etc/shadow", 0, nil
	hardlink := symlink
	hardlink.hdr.Typeflag = tar.TypeLink
	dirLink := entry{hdr: tar.Header{Name: "blobs", Typeflag: tar.TypeSymlink, Linkname: "/tmp", Format: tar.FormatPAX}}
	fifo := entry{hdr: tar.Header{Name: "blobs/sha256/" + strings.Repeat("ab", 32), Typeflag: tar.TypeFifo, Format: tar.FormatPAX}}
	bigPAX := reg("oci-layout-x", nil)
	bigPAX.hdr.PAXRecords = map[string]string{"comment": strings.Repeat("x", 128<<10)}

	for _, tc := range []struct {
		name   string
		es     []entry
		limits stores.ArchiveOptions
		want   string
		is     func(error) bool // errdefs.IsInvalidArgument when nil
	}{
		{"path traversal", with(reg("../escaped", []byte("x"))), stores.ArchiveOptions{}, "escapes", nil},
		{"path traversal in blobs", with(reg("blobs/sha256/../../../escaped", []byte("x"))), stores.ArchiveOptions{}, "escapes", nil},
		{"absolute path", with(reg("/tmp/escaped", []byte("x"))), stores.ArchiveOptions{}, "absolute", nil},
		{"unclean path", with(reg("blobs//sha256/x", []byte("x"))), stores.ArchiveOptions{}, "not clean", nil},
		{"outside the layout", with(reg("etc/passwd", []byte("x"))), stores.ArchiveOptions{}, "not part of an OCI image layout", nil},
		{"symlink blob", replaced(symlink), stores.ArchiveOptions{}, "links are not allowed", nil},
		{"hardlink blob", replaced(hardlink), stores.ArchiveOptions{}, "links are not allowed", nil},
		{"symlinked blobs dir", with(dirLink), stores.ArchiveOptions{}, "links are not allowed", nil},
		{"fifo", with(fifo), stores.ArchiveOptions{}, "FIFOs", nil},
		{"oversized blob", es, stores.ArchiveOptions{MaxBlobSize: 64}, "limit", nil},
		{"too many entries", es, stores.ArchiveOptions{MaxEntries: 2}, "entries", nil},
		{"oversized PAX header", with(bigPAX), stores.ArchiveOptions{}, "PAX header", nil},
		{"duplicate blob", append(append([]entry(nil), es...), blob), stores.ArchiveOptions{}, "duplicate", nil},
		{"duplicate index.json", append(append([]entry(nil), es...), es[len(es)-1]), stores.ArchiveOptions{}, "duplicate", nil},
		{"blob not matching its name", replaced(reg(blob.hdr.Name, bytes.Repeat([]byte{1}, len(blob.data)))), stores.ArchiveOptions{}, "does not match digest", errdefs.IsDataLoss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeTar(t, tc.es)
			dst := newStore(t)
			tmp := t.TempDir()
			_, err := Import(context.Background(), p, dst, "x", ImportOptions{TmpDir: tmp, Limits: tc.limits})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Import: %v, want an error saying %q", err, tc.want)
			}
			is := tc.is
			if is == nil {
				is = errdefs.IsInvalidArgument
			}
			if !is(err) {
				t.Fatalf("Import: %v, not the kind of error wanted", err)
			}
			if tags, err := dst.Tags(context.Background()); err != nil || len(tags) != 0 {
				t.Fatalf("a refused import left tags %v (%v)", tags, err)
			}
			assertEmpty(t, tmp)
			for _, p := range []string{filepath.Join(filepath.Dir(p), "escaped"), filepath.Join(filepath.Dir(tmp), "escaped")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s was written", p)
				}
			}
		})
	}
}

func TestImportRefusesAChecksumMismatch(t *testing.T) {
	p := writeTar(t, exportEntries(t))
	if err := os.WriteFile(p+".sha256", []byte(strings.Repeat("0", 64)+"  checkpoint.tar\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := newStore(t)
	if _, err := Import(context.Background(), p, dst, "x", ImportOptions{}); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "checkpoint.tar.sha256 says") {
		t.Fatalf("Import: %v, want refused by the checksum", err)
	}
	if tags, _ := dst.Tags(context.Background()); len(tags) != 0 {
		t.Fatalf("a refused import left tags %v", tags)
	}
	os.Remove(p + ".sha256")
	if _, err := Import(context.Background(), p, dst, "x", ImportOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Import without a .sha256: %v, want refused", err)
	}
	if _, err := Import(context.Background(), p, dst, "x", ImportOptions{NoChecksum: true}); err != nil {
		t.Fatalf("Import without a .sha256, NoChecksum: %v", err)
	}
}

// assertEmpty fails unless dir holds nothing.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	left, err := os.ReadDir(dir)
	if err != nil || len(left) != 0 {
		t.Fatalf("%s holds %v (%v)", dir, left, err)
	}
}
