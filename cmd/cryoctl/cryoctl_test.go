package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/snapshot/archive"
	"github.com/cryo-runtime/cryo/stores"
)

type env struct {
	t        *testing.T
	dir      string
	cfg      string
	priv     string
	pub      string
	otherPub string
}

func newEnv(t *testing.T) *env {
	e := &env{t: t, dir: t.TempDir()}
	e.cfg = filepath.Join(e.dir, "config.toml")
	// The node cache of the test, never the host's /var/lib/cryo.
	cfg := fmt.Sprintf("[snapshot]\ncache_dir = %q\n", filepath.Join(e.dir, "node"))
	if err := os.WriteFile(e.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	e.priv, e.pub = filepath.Join(e.dir, "sign.key"), filepath.Join(e.dir, "sign.pub")
	if err := snapshot.GenerateSigningKey(e.priv, e.pub); err != nil {
		t.Fatal(err)
	}
	e.otherPub = filepath.Join(e.dir, "other.pub")
	if err := snapshot.GenerateSigningKey(filepath.Join(e.dir, "other.key"), e.otherPub); err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs cryoctl with args (plus --config and --cache-dir) and returns
// its stdout.
func (e *env) run(args ...string) (string, error) {
	var out, errOut bytes.Buffer
	a := &App{Stdout: &out, Stderr: &errOut}
	cmd := newRootCommand(a)
	cmd.SetArgs(append([]string{"--config", e.cfg, "--cache-dir", filepath.Join(e.dir, "cache")}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func (e *env) mustRun(args ...string) string {
	e.t.Helper()
	out, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("cryoctl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (e *env) runJSON(v any, args ...string) {
	e.t.Helper()
	out := e.mustRun(append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("cryoctl %s: output %q: %v", strings.Join(args, " "), out, err)
	}
}

func (e *env) store(url string) stores.Store {
	e.t.Helper()
	s, _, err := stores.Open(context.Background(), url, stores.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// writeSnapshot writes a small snapshot (two files, some zero chunks) to
// store url under tag, signed with e's key when sign is set.
func (e *env) writeSnapshot(url, tag string, seed byte, sign bool, expires time.Time) ocispec.Descriptor {
	e.t.Helper()
	ram := make([]byte, 3<<20)
	for i := 0; i < len(ram)/2; i++ {
		ram[i] = seed + byte(i*7)
	}
	md := snapshot.Metadata{
		Expires: expires,
		Source:  snapshot.SourceInfo{SandboxID: "sb-1", PodName: "web-0", Namespace: "team"},
		Fingerprint: fingerprint.Fingerprint{QEMUVersion: "7.2.0", MachineType: "pc-q35-7.2", CPUModel: "qemu64",
			MemoryMiB: 3, VCPUs: 1, Accel: "tcg"},
	}
	src := &snapshot.Source{Metadata: md, Files: []snapshot.SourceFile{
		snapshot.BytesSourceFile(snapshot.FileRAM, ram),
		snapshot.BytesSourceFile(snapshot.FileDevState, []byte("device state "+string(rune('a'+seed)))),
	}}
	var o snapshot.WriteOptions
	o.ChunkSize = 1 << 20
	if sign {
		k, err := snapshot.LoadSigningKey(e.priv)
		if err != nil {
			e.t.Fatal(err)
		}
		o.SigningKey = k
	}
	d, _, err := snapshot.Write(context.Background(), e.store(url), tag, src, o)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func TestInspectVerifyLs(t *testing.T) {
	e := newEnv(t)
	url := "file://" + e.dir + "/store/web"
	d := e.writeSnapshot(url, "v1", 1, true, time.Time{})

	var info snapshotInfo
	e.runJSON(&info, "--verify-key", e.pub, "inspect", url+":v1")
	if info.Manifest != d.Digest || !info.Signed || info.Chunks != 3 || info.Metadata.Source.PodName != "web-0" || info.Expired {
		t.Fatalf("inspect = %+v", info)
	}
	if out := e.mustRun("inspect", url+"@"+d.Digest.String()); !strings.Contains(out, "pc-q35-7.2") || !strings.Contains(out, d.Digest.String()) {
		t.Fatalf("inspect text:\n%s", out)
	}
	var vr verifyResult
	e.runJSON(&vr, "--verify-key", e.pub, "--require-signature", "verify", url+":v1")
	if !vr.OK || !vr.Signed || vr.Chunks != 3 {
		t.Fatalf("verify = %+v", vr)
	}
	if _, err := e.run("--verify-key", e.otherPub, "verify", url+":v1"); !errdefs.IsUnauthorized(err) {
		t.Fatalf("verify with another key: %v, want unauthenticated", err)
	}
	var ls []lsEntry
	e.runJSON(&ls, "ls", "-l", url)
	if len(ls) != 1 || ls[0].Tag != "v1" || ls[0].Digest != d.Digest || ls[0].Created == nil {
		t.Fatalf("ls = %+v", ls)
	}
	e.runJSON(&ls, "ls", "-a", url)
	if len(ls) != 2 || ls[0].Tag != snapshot.SignatureTag(d.Digest) {
		t.Fatalf("ls -a = %+v", ls)
	}
	if _, err := e.run("inspect", url); err == nil || !strings.Contains(err.Error(), "names no snapshot") {
		t.Fatalf("inspect without a tag: %v", err)
	}
	if _, err := e.run("-o", "yaml", "ls", url); err == nil {
		t.Fatal("-o yaml accepted")
	}
}

func sha256File(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func TestExportImport(t *testing.T) {
	e := newEnv(t)
	src := "file://" + e.dir + "/src/web"
	d := e.writeSnapshot(src, "v1", 2, true, time.Time{})
	out := filepath.Join(e.dir, "export")
	var res archive.Exported
	e.runJSON(&res, "--verify-key", e.pub, "export", src+":v1", out)
	dir := filepath.Join(out, "team", "web-0")
	if res.Path != filepath.Join(dir, "checkpoint.tar") || res.Manifest != d.Digest {
		t.Fatalf("export = %+v", res)
	}
	for _, f := range []string{"checkpoint.tar", "checkpoint.tar.sha256", "metadata.json"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v", f, err, st.Mode().Perm())
		}
	}
	sum, _ := os.ReadFile(filepath.Join(dir, "checkpoint.tar.sha256"))
	if got := sha256File(t, res.Path); string(sum) != got+"  checkpoint.tar\n" {
		t.Fatalf(".sha256 = %q, file hashes to %s", sum, got)
	}
	var md archive.Metadata
	b, _ := os.ReadFile(filepath.Join(dir, "metadata.json"))
	if err := json.Unmarshal(b, &md); err != nil || md.Manifest != d.Digest || !md.Signed || md.Snapshot.Source.Namespace != "team" {
		t.Fatalf("metadata.json = %+v, %v", md, err)
	}

	dst := "file://" + e.dir + "/dst/web"
	var ir importResult
	e.runJSON(&ir, "--verify-key", e.pub, "--require-signature", "import", res.Path, dst+":restored")
	if ir.Manifest != d.Digest || !ir.Signed || !ir.ChunksVerified {
		t.Fatalf("import = %+v", ir)
	}
	var vr verifyResult
	e.runJSON(&vr, "--verify-key", e.pub, "--require-signature", "verify", dst+":restored")
	if !vr.OK || vr.Manifest != d.Digest {
		t.Fatalf("verify imported = %+v", vr)
	}
}

// tamper rewrites the exported archive with an altered snapshot manifest,
// dropping (or keeping) the signature, and rewrites the .sha256 to match,
// as an attacker with write access to the export directory could.
func tamper(t *testing.T, archive string, keepSig bool) {
	ctx := context.Background()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	staging, err := stores.NewFileStore(filepath.Join(t.TempDir(), "l"))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := stores.ReadArchive(ctx, f, staging, stores.ArchiveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out, sigs []ocispec.Descriptor
	for _, r := range roots {
		if keepSig && snapshot.IsSignatureTag(r.Annotations[ocispec.AnnotationRefName]) {
			sigs = append(sigs, r)
		}
	}
	for _, r := range roots {
		if snapshot.IsSignatureTag(r.Annotations[ocispec.AnnotationRefName]) {
			continue
		}
		mb, err := stores.FetchAll(ctx, staging, r, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var m ocispec.Manifest
		json.Unmarshal(mb, &m)
		m.Annotations = map[string]string{"evil": "yes"}
		nb, _ := json.Marshal(m)
		nd := ocispec.Descriptor{MediaType: r.MediaType, ArtifactType: r.ArtifactType, Digest: digestOf(nb), Size: int64(len(nb)),
			Annotations: r.Annotations}
		if err := staging.Push(ctx, nd, bytes.NewReader(nb)); err != nil {
			t.Fatal(err)
		}
		out = append(out, nd)
		for _, sd := range sigs { // pass the old signature off as the new manifest's
			sd.Annotations = map[string]string{ocispec.AnnotationRefName: snapshot.SignatureTag(nd.Digest)}
			out = append(out, sd)
		}
	}
	var buf bytes.Buffer
	if err := stores.WriteArchive(ctx, &buf, staging, out); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(buf.Bytes())
	os.WriteFile(archive+".sha256", []byte(hex.EncodeToString(h[:])+"  checkpoint.tar\n"), 0o600)
}

func TestImportRefusesTampered(t *testing.T) {
	e := newEnv(t)
	src := "file://" + e.dir + "/src/web"
	e.writeSnapshot(src, "v1", 3, true, time.Time{})
	export := func(name string) string {
		var res archive.Exported
		e.runJSON(&res, "export", "--id", name, src+":v1", filepath.Join(e.dir, "export"))
		return res.Path
	}
	dst := "file://" + e.dir + "/dst/web"
	assertNotImported := func() {
		t.Helper()
		if tags, err := e.store(dst).Tags(context.Background()); err != nil || len(tags) != 0 {
			t.Fatalf("refused import left tags %v (%v)", tags, err)
		}
	}

	t.Run("checksum-not-rewritten", func(t *testing.T) {
		p := export("a")
		b, _ := os.ReadFile(p)
		os.WriteFile(p, append(b, "junk after the tar"...), 0o600) // only the checksum notices
		if _, err := e.run("import", p, dst+":x"); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "checkpoint.tar.sha256 says") {
			t.Fatalf("err = %v, want refused by checksum", err)
		}
		assertNotImported()
	})
	t.Run("checksum-rewritten-signature-dropped", func(t *testing.T) {
		p := export("b")
		tamper(t, p, false)
		_, err := e.run("--verify-key", e.pub, "--require-signature", "import", p, dst+":x")
		if !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), "signature") {
			t.Fatalf("err = %v, want refused by signature", err)
		}
		assertNotImported()
	})
	t.Run("checksum-rewritten-signature-kept", func(t *testing.T) {
		p := export("c")
		tamper(t, p, true)
		_, err := e.run("--verify-key", e.pub, "--require-signature", "import", p, dst+":x")
		if !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), "does not sign") {
			t.Fatalf("err = %v, want refused by signature", err)
		}
		assertNotImported()
	})
	t.Run("no-checksum-file", func(t *testing.T) {
		p := export("d")
		os.Remove(p + ".sha256")
		if _, err := e.run("import", p, dst+":x"); err == nil {
			t.Fatal("import without .sha256 succeeded")
		}
		assertNotImported()
	})
}

func TestRmGCPull(t *testing.T) {
	e := newEnv(t)
	url := "file://" + e.dir + "/store/web"
	old := e.writeSnapshot(url, "old", 4, true, time.Now().Add(-time.Minute))
	keep := e.writeSnapshot(url, "keep", 5, true, time.Now().Add(time.Hour))

	var gr gcResult
	e.runJSON(&gr, "gc", "--dry-run", "--grace", "0s", url)
	if len(gr.Stores) != 1 || len(gr.Stores[0].Expired) != 1 || gr.Stores[0].Blobs.Deleted != 0 {
		t.Fatalf("gc --dry-run = %+v", gr)
	}
	e.runJSON(&gr, "gc", "--grace", "0s", url)
	if gr.Materialized == nil || len(gr.Materialized.Removed) != 0 {
		t.Fatalf("gc of an empty node cache: materialized %+v", gr.Materialized)
	}
	if gr.Bases == nil || gr.Bases.Live != 0 || gr.Bases.Removed != 0 {
		t.Fatalf("gc of an empty node cache: bases %+v", gr.Bases)
	}
	r := gr.Stores[0]
	// old's manifest, config, 2 data chunks, devstate chunk, signature
	// manifest and payload go; the empty config blob is shared.
	if len(r.Expired) != 1 || r.Expired[0] != "old" || r.Blobs.Deleted != 7 {
		t.Fatalf("gc = %+v", r)
	}
	s := e.store(url)
	if ok, _ := s.Exists(context.Background(), old); ok {
		t.Fatal("expired manifest survived gc")
	}
	e.mustRun("--verify-key", e.pub, "--require-signature", "verify", url+":keep")

	var pr pullResult
	e.runJSON(&pr, "pull", url+":keep")
	if pr.Manifest != keep.Digest || pr.Downloaded != pr.Bytes || pr.Blobs != 8 {
		t.Fatalf("pull = %+v", pr)
	}
	e.runJSON(&pr, "pull", url+":keep")
	if pr.Downloaded != 0 {
		t.Fatalf("second pull downloaded %d bytes", pr.Downloaded)
	}

	e.mustRun("rm", url+":keep")
	if tags, _ := s.Tags(context.Background()); len(tags) != 0 {
		t.Fatalf("tags after rm: %v (the signature tag must go too)", tags)
	}
	if _, err := e.run("rm", url+":keep"); !errdefs.IsNotFound(err) {
		t.Fatalf("second rm: %v", err)
	}
}

// TestBenchBootedMemoryFlag: a --booted-memory the node config would
// refuse is refused, naming the flag, before the bench starts anything.
func TestBenchBootedMemoryFlag(t *testing.T) {
	e := newEnv(t)
	for _, v := range []string{"lazy", "", "SERVED"} {
		_, err := e.run("bench", "--quick", "--booted-memory", v)
		if err == nil || !strings.Contains(err.Error(), "--booted-memory") || !strings.Contains(err.Error(), "must be owned or served") {
			t.Errorf("--booted-memory %q: %v, want an error naming the flag", v, err)
		}
	}
	for _, v := range []string{"owned", "served"} {
		if err := checkBootedMemory(v); err != nil {
			t.Errorf("--booted-memory %s: %v", v, err)
		}
	}
	f := newBenchCommand(&App{}).Flags().Lookup("booted-memory")
	if f == nil || f.DefValue != "owned" {
		t.Fatalf("--booted-memory flag: %+v, want default owned", f)
	}
}
