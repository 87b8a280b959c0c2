package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const testCS = MinChunkSize // 64 KiB chunks keep unit tests small

// textLike fills b with compressible, log-like text.
func textLike(r *rand.Rand, b []byte) {
	words := []string{"kernel: ", "virtio ", "GET /index.html ", "200 ", "user=42 ", "error ", "ok\n", "2026-11-30T05:00:00Z "}
	for i := 0; i < len(b); {
		i += copy(b[i:], words[r.IntN(len(words))])
	}
}

// writeTestFile writes a file of size bytes whose chunk i is, by i%5:
// random, text, a hole, written zeros, half random and half zeros.
func writeTestFile(t testing.TB, path string, size, cs int64, seed uint64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	buf := make([]byte, cs)
	for i := int64(0); i*cs < size; i++ {
		b := buf[:min(cs, size-i*cs)]
		clear(b)
		switch i % 5 {
		case 0:
			fillRandom(r, b)
		case 1:
			textLike(r, b)
		case 2:
			continue
		case 3:
		case 4:
			fillRandom(r, b[:len(b)/2])
		}
		if _, err := f.WriteAt(b, i*cs); err != nil {
			t.Fatal(err)
		}
	}
}

func fillRandom(r *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

type testSnap struct {
	dir   string
	paths SourcePaths
	md    Metadata
}

func newTestSnap(t testing.TB) *testSnap {
	t.Helper()
	dir := t.TempDir()
	ts := &testSnap{dir: dir, paths: SourcePaths{
		RAM:      filepath.Join(dir, "ram"),
		Disks:    map[string]string{"root": filepath.Join(dir, "root.img"), "data": filepath.Join(dir, "data.img")},
		DevState: filepath.Join(dir, "devstate"),
		Spec:     []byte(`{"containers":[{"id":"c1"}]}`),
	}}
	writeTestFile(t, ts.paths.RAM, 40*testCS-1000, testCS, 1)
	writeTestFile(t, ts.paths.Disks["root"], 10*testCS, testCS, 2)
	writeTestFile(t, ts.paths.Disks["data"], 5*testCS-5, testCS, 3)
	writeTestFile(t, ts.paths.DevState, 300<<10, testCS, 4)
	ts.md = Metadata{
		Source:      SourceInfo{SandboxID: "sb1", PodName: "web", Namespace: "default"},
		Fingerprint: fingerprint.Fingerprint{QEMUVersion: "7.2.0", MachineType: "pc-q35-7.2", CPUModel: "qemu64", MemoryMiB: 512, VCPUs: 1, Accel: "tcg"},
		Containers:  []Container{{ID: "c1", Image: "docker.io/library/busybox:latest"}},
		Network:     Network{Hostname: "web", Interfaces: []Interface{{Name: "eth0", MAC: "02:00:00:00:00:01", Addresses: []string{"10.0.0.2/24"}}}},
	}
	return ts
}

func (ts *testSnap) write(t testing.TB, store *memStore, ref string, opts WriteOptions) (WriteStats, *Snapshot) {
	t.Helper()
	src, err := NewSource(ts.md, ts.paths)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if opts.ChunkSize == 0 {
		opts.ChunkSize = testCS
	}
	desc, st, err := Write(context.Background(), store, ref, src, opts)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if got, err := store.Resolve(context.Background(), ref); err != nil || got.Digest != desc.Digest {
		t.Fatalf("ref %s resolves to %v, %v; want %s", ref, got.Digest, err, desc.Digest)
	}
	return st, nil
}

// checkFiles compares materialized files with the sources.
func (ts *testSnap) checkFiles(t *testing.T, m *Materialized) {
	t.Helper()
	pairs := map[string]string{ts.paths.RAM: m.RAM, ts.paths.DevState: m.DevState}
	for name, p := range ts.paths.Disks {
		pairs[p] = m.Disks[name]
	}
	for src, dst := range pairs {
		a, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s", dst, src)
		}
		st, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o400 {
			t.Errorf("%s mode %v, want 0400", dst, st.Mode().Perm())
		}
	}
	spec, err := m.ReadSpec()
	if err != nil || !bytes.Equal(spec, ts.paths.Spec) {
		t.Errorf("spec %q, %v; want %q", spec, err, ts.paths.Spec)
	}
}

func open(t *testing.T, store *memStore, ref string, opts ReadOptions) *Snapshot {
	t.Helper()
	s, err := Open(context.Background(), store, ref, opts)
	if err != nil {
		t.Fatalf("open %s: %v", ref, err)
	}
	return s
}

// assertEmptyCache fails unless dir holds nothing (no partial result, no
// temporary directory).
func assertEmptyCache(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in cache: %s", e.Name())
	}
}

func TestRoundTrip(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	st, _ := ts.write(t, store, "v1", WriteOptions{})

	// ram: 40 chunks, by i%5: random, text, hole, zeros, half: 24 stored.
	// root: 10 chunks -> 6; data: 5 chunks -> 3 (the partial 5th is
	// half random); devstate: 5 chunks -> 3; spec: 1.
	if st.Chunks != 24+6+3+3+1 {
		t.Errorf("chunks %d, want %d", st.Chunks, 37)
	}
	if st.HoleChunks == 0 || st.ZeroChunks == 0 {
		t.Errorf("hole chunks %d, zero chunks %d: both kinds must be skipped", st.HoleChunks, st.ZeroChunks)
	}
	if st.ReadBytes >= st.RawBytes {
		t.Errorf("read %d of %d bytes: holes were read", st.ReadBytes, st.RawBytes)
	}
	if st.StoredBytes >= st.DataBytes || st.UploadedBytes != st.StoredBytes {
		t.Errorf("stored %d, data %d, uploaded %d", st.StoredBytes, st.DataBytes, st.UploadedBytes)
	}

	s := open(t, store, "v1", ReadOptions{})
	if s.Metadata.Source.PodName != "web" || s.Metadata.Fingerprint.MachineType != "pc-q35-7.2" || s.Metadata.FormatVersion != FormatVersionNoDelta {
		t.Errorf("metadata %+v", s.Metadata)
	}
	if s.Metadata.Totals.Chunks != st.Chunks || s.Chunks() != st.Chunks {
		t.Errorf("totals %+v, %d chunks", s.Metadata.Totals, s.Chunks())
	}
	vs, err := s.Verify(context.Background())
	if err != nil || vs.Chunks != st.Chunks {
		t.Fatalf("verify: %+v, %v", vs, err)
	}

	cache := t.TempDir()
	m, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache))
	if err != nil {
		t.Fatal(err)
	}
	if m.CacheHit || m.Dir != nodecache.OpenSnapshots(cache).Path(s.Descriptor.Digest) {
		t.Errorf("first materialize: hit %v dir %s", m.CacheHit, m.Dir)
	}
	ts.checkFiles(t, m)
	var sst syscall.Stat_t
	if err := syscall.Stat(m.RAM, &sst); err != nil {
		t.Fatal(err)
	}
	if sst.Blocks*512 >= sst.Size {
		t.Errorf("materialized RAM not sparse: %d blocks for %d bytes", sst.Blocks, sst.Size)
	}

	// A second materialization, even through a new Open by pinned digest,
	// is a cache hit that fetches no chunk.
	s2 := open(t, store, "v1@"+s.Descriptor.Digest.String(), ReadOptions{})
	before := store.fetches.Load()
	m2, err := s2.Materialize(context.Background(), nodecache.OpenSnapshots(cache))
	if err != nil || !m2.CacheHit || m2.Dir != m.Dir {
		t.Fatalf("second materialize: %+v, %v", m2, err)
	}
	if n := store.fetches.Load() - before; n != 0 {
		t.Errorf("cache hit fetched %d times", n)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 1 {
		t.Errorf("cache holds %d entries, want 1", len(ents))
	}
}

func TestIncrementalUploadsOnlyChangedChunks(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "encrypted"}[enc], func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			var opts WriteOptions
			if enc {
				opts.EncryptionKey = bytes.Repeat([]byte{7}, 32)
				// Chunks deduplicate within one lineage (a chain inherits
				// it from its page index or parent).
				opts.Lineage = NewLineage()
			}
			first, _ := ts.write(t, store, "v1", opts)
			// Change 2 stored chunks of the RAM file (of 37).
			f, err := os.OpenFile(ts.paths.RAM, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range []int64{0, 5} {
				if _, err := f.WriteAt([]byte("changed"), i*testCS+100); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()
			second, _ := ts.write(t, store, "v2", opts)
			// 2 chunks, the config and the manifest.
			if second.UploadedChunks != 2 || second.SkippedChunks != first.Chunks-2 {
				t.Errorf("second write uploaded %d chunks, skipped %d; want 2, %d", second.UploadedChunks, second.SkippedChunks, first.Chunks-2)
			}
			if second.UploadedBytes*5 > first.UploadedBytes {
				t.Errorf("second write uploaded %d bytes, first %d", second.UploadedBytes, first.UploadedBytes)
			}
		})
	}
}

func TestEncryption(t *testing.T) {
	ts := newTestSnap(t)
	store := newMemStore()
	key := bytes.Repeat([]byte{1}, 32)
	ts.write(t, store, "enc", WriteOptions{EncryptionKey: key})
	ts.write(t, store, "plain", WriteOptions{})
	ctx := context.Background()

	// Chunks hold no plaintext: the text-like chunk 1 of RAM is gone.
	raw, _ := os.ReadFile(ts.paths.RAM)
	probe := raw[testCS : testCS+64]
	s := open(t, store, "enc", ReadOptions{})
	for _, c := range s.chunks {
		if bytes.Contains(store.get(c.desc.Digest), probe) {
			t.Fatalf("plaintext in encrypted chunk %s", c.desc.Digest)
		}
	}
	if !s.Encrypted() {
		t.Fatal("not marked encrypted")
	}
	if _, err := s.Materialize(ctx, nodecache.OpenSnapshots(t.TempDir())); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("materialize without key: %v", err)
	}
	if _, err := Open(ctx, store, "enc", ReadOptions{DecryptionKey: bytes.Repeat([]byte{2}, 32)}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("open with the wrong key: %v", err)
	}
	if _, err := Open(ctx, store, "plain", ReadOptions{RequireEncryption: true}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("plaintext snapshot with RequireEncryption: %v", err)
	}
	s = open(t, store, "enc", ReadOptions{DecryptionKey: key, RequireEncryption: true})
	m, err := s.Materialize(ctx, nodecache.OpenSnapshots(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ts.checkFiles(t, m)

	// A container spec would sit in clear in the config: refused.
	md := ts.md
	md.Containers = []Container{{ID: "c1", Spec: []byte(`{"env":["PASSWORD=x"]}`)}}
	src, err := NewSource(md, ts.paths)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, _, err := Write(ctx, store, "bad", src, WriteOptions{ChunkSize: testCS, EncryptionKey: key}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("spec in encrypted config: %v", err)
	}
}

func TestSignature(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	if err := GenerateSigningKey(priv, pub); err != nil {
		t.Fatal(err)
	}
	sk, err := LoadSigningKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := GenerateSigningKey(other+".pem", other+".pub"); err != nil {
		t.Fatal(err)
	}
	otherPK, _ := LoadPublicKey(other + ".pub")

	ts := newTestSnap(t)
	store := newMemStore()
	ts.write(t, store, "signed", WriteOptions{SigningKey: sk})
	ts.md.Source.PodName = "unsigned" // a different manifest
	ts.write(t, store, "unsigned", WriteOptions{})
	ctx := context.Background()

	s := open(t, store, "signed", ReadOptions{PublicKey: pk, RequireSignature: true})
	if !s.Signed {
		t.Error("Signed false")
	}
	// By pinned digest alone, too.
	if s2 := open(t, store, s.Descriptor.Digest.String(), ReadOptions{PublicKey: pk, RequireSignature: true}); !s2.Signed {
		t.Error("pinned: Signed false")
	}
	if _, err := Open(ctx, store, "unsigned", ReadOptions{PublicKey: pk, RequireSignature: true}); !errdefs.IsUnauthorized(err) {
		t.Errorf("unsigned: %v", err)
	}
	if _, err := Open(ctx, store, "signed", ReadOptions{PublicKey: otherPK, RequireSignature: true}); !errdefs.IsUnauthorized(err) {
		t.Errorf("wrong key: %v", err)
	}
	if _, err := Open(ctx, store, "signed", ReadOptions{RequireSignature: true}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("required without key: %v", err)
	}
	// A flipped bit in the signature manifest or payload is refused.
	sigDesc, _ := store.Resolve(ctx, SignatureTag(s.Descriptor.Digest))
	var sm ocispec.Manifest
	if err := json.Unmarshal(store.get(sigDesc.Digest), &sm); err != nil {
		t.Fatal(err)
	}
	for _, d := range []digest.Digest{sigDesc.Digest, sm.Layers[0].Digest} {
		good := append([]byte(nil), store.get(d)...)
		store.corrupt(d, func(b []byte) []byte { b[len(b)/2] ^= 1; return b })
		if _, err := Open(ctx, store, "signed", ReadOptions{PublicKey: pk}); !errdefs.IsDataLoss(err) {
			t.Errorf("corrupt signature blob %s: %v", d, err)
		}
		store.corrupt(d, func([]byte) []byte { return good })
	}
	open(t, store, "signed", ReadOptions{PublicKey: pk, RequireSignature: true})

	// Point the signature tag of the unsigned snapshot at the signature of
	// the signed one: the subject does not match.
	u, _ := store.Resolve(ctx, "unsigned")
	sig, _ := store.Resolve(ctx, SignatureTag(s.Descriptor.Digest))
	if err := store.Tag(ctx, sig, SignatureTag(u.Digest)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, store, "unsigned", ReadOptions{PublicKey: pk}); !errdefs.IsUnauthorized(err) {
		t.Errorf("borrowed signature: %v", err)
	}
}

func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}
