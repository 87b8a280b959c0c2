package sandbox

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/pagefs"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/vmm"
)

// fakeVM records what the pause window asks of the VM.
type fakeVM struct {
	calls *[]string
	disks []vmm.Disk
}

func (v fakeVM) Pause(context.Context) error  { *v.calls = append(*v.calls, "stop"); return nil }
func (v fakeVM) Resume(context.Context) error { *v.calls = append(*v.calls, "cont"); return nil }
func (v fakeVM) SaveState(_ context.Context, f *os.File) error {
	*v.calls = append(*v.calls, "save state")
	_, err := f.WriteString("device state")
	return err
}
func (v fakeVM) SaveStateLive(context.Context, *os.File, vmm.LiveSave) error {
	panic("a served RAM's device state is saved stopped")
}
func (v fakeVM) SnapshotDisk(_ context.Context, id, _ string) error {
	*v.calls = append(*v.calls, "freeze "+id)
	return nil
}
func (v fakeVM) Disks() []vmm.Disk                    { return v.disks }
func (v fakeVM) Fingerprint() fingerprint.Fingerprint { return fingerprint.Fingerprint{} }

// fakeServed is a served RAM in the pause window: a layered pagefs file
// over a plain source; what the pause does not call panics.
type fakeServed struct {
	guestMemory
	calls   *[]string
	file    *pagefs.File
	sealErr error
	// syncTakes is how long the in-pause write-back takes.
	syncTakes time.Duration
}

func (s fakeServed) preSync() error { *s.calls = append(*s.calls, "presync"); return nil }
func (s fakeServed) sync() error {
	*s.calls = append(*s.calls, "sync")
	time.Sleep(s.syncTakes)
	return nil
}
func (s fakeServed) lost(_ context.Context, c *capture) {
	*s.calls = append(*s.calls, "lost")
	if c.gen != nil {
		c.gen.Abandon()
		c.gen = nil
	}
}
func (s fakeServed) capture(c *capture, _ bool) error {
	*s.calls = append(*s.calls, "seal")
	if s.sealErr != nil {
		return s.sealErr
	}
	side, err := os.CreateTemp("", "side-")
	if err != nil {
		return err
	}
	os.Remove(side.Name())
	c.gen, err = s.file.Seal(side)
	return err
}

type bytesSource struct{ *bytes.Reader }

func (b bytesSource) Size() int64 { return b.Reader.Size() }

func layered(t *testing.T, src pagefs.Source) *pagefs.File {
	t.Helper()
	layer, err := os.Create(filepath.Join(t.TempDir(), "ram.layer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.Close() })
	if err := layer.Truncate(src.Size()); err != nil {
		t.Fatal(err)
	}
	f, err := pagefs.NewLayered("ram", src, layer)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPauseWindowServed: a served RAM is readied (written back, pass
// after pass) before the pause and written back once in it, sealed after
// the device state is saved and before the VM continues, and neither
// copied nor put in the stream; the pause's parts say where it went. A
// failure resumes the VM, then tells the RAM the checkpoint is lost.
func TestPauseWindowServed(t *testing.T) {
	var calls []string
	vm := fakeVM{calls: &calls,
		disks: []vmm.Disk{{ID: "root", Path: "/nonexistent/root.qcow2", Format: "qcow2"}, {ID: "base", ReadOnly: true}}}
	ram := fakeServed{calls: &calls, file: layered(t, bytesSource{bytes.NewReader(make([]byte, 1<<20))}), syncTakes: 20 * time.Millisecond}
	work := t.TempDir()
	c, err := pauseWindow(context.Background(), vm, ram, t.TempDir(), &sandboxRecord{}, work, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.cleanup()
	want := []string{"presync", "stop", "freeze root", "sync", "save state", "seal", "cont"}
	if !slices.Equal(calls, want) {
		t.Errorf("pause window did %q, want %q", calls, want)
	}
	if c.gen == nil || c.ram != "" || c.record.RAMInStream {
		t.Errorf("capture: generation %v, ram file %q, ram in stream %v; want a generation only", c.gen != nil, c.ram, c.record.RAMInStream)
	}
	p := c.parts
	if sum := p.stop + p.disks + p.ramSync + p.state + p.ramCapture + p.resume; p.ramSync < ram.syncTakes || sum > c.pause || p.state <= 0 || p.ramCapture <= 0 {
		t.Errorf("pause %s in parts %+v (sum %s): want the in-pause sync's %s in ram_sync, every step measured, the sum within the pause", c.pause, p, sum, ram.syncTakes)
	}
	if f := p.fields(); f["pause_ram_sync"] != p.ramSync || len(f) < 5 {
		t.Errorf("log fields %v", f)
	}
	c.cleanup()
	if c.gen != nil {
		t.Error("cleanup left the generation open")
	}

	// A failed seal resumes the VM and leaves nothing.
	calls = nil
	ram.sealErr = errors.New("boom")
	work = t.TempDir()
	if _, err := pauseWindow(context.Background(), vm, ram, t.TempDir(), &sandboxRecord{}, work, false, false); err == nil {
		t.Fatal("a failed seal did not fail the capture")
	}
	if want := []string{"presync", "stop", "freeze root", "sync", "save state", "seal", "cont", "lost"}; !slices.Equal(calls, want) {
		t.Errorf("after a failed seal: %q, want %q", calls, want)
	}
	// (the checkpoint's work dir, which holds the device state, is removed
	// by its own step)
}

// servedChain is a sandbox whose RAM is served from a snapshot in a file
// store, as a lazy restore leaves it, checkpointed with publish.
type servedChain struct {
	t     *testing.T
	store stores.Store
	dir   string
	sb    *Sandbox
	file  *pagefs.File // the served RAM's file, which the guest writes
	ram   []byte       // what the guest's RAM holds
	ropts snapshot.ReadOptions
	wopts snapshot.WriteOptions
	gen   int
}

const servedCS = 64 << 10

func newServedChain(t *testing.T, key []byte) *servedChain {
	dir := t.TempDir()
	sc := &servedChain{t: t, dir: dir, ram: make([]byte, 40*servedCS)}
	sc.wopts = snapshot.WriteOptions{ChunkSize: servedCS, EncryptionKey: key}
	sc.ropts = snapshot.ReadOptions{DecryptionKey: key}
	r := rand.New(rand.NewPCG(1, 1))
	for i := range sc.ram {
		if i/servedCS%3 != 2 {
			sc.ram[i] = byte(r.Uint32())
		}
	}
	var err error
	sc.store, _, err = stores.Open(context.Background(), sc.url(0), stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	src := &snapshot.Source{Files: []snapshot.SourceFile{snapshot.BytesSourceFile(snapshot.FileRAM, sc.ram)}}
	if _, _, err := snapshot.Write(context.Background(), sc.store, "g00", src, sc.wopts); err != nil {
		t.Fatal(err)
	}
	sc.serve("g00")
	return sc
}

func (sc *servedChain) url(g int) string {
	return "file://" + filepath.Join(sc.dir, "store") + ":g" + itoa(g)
}

func itoa(i int) string { return string(rune('0'+i/10)) + string(rune('0'+i%10)) }

// serve restores ref as a lazy restore does: RAM served by a FileReader,
// writes in a layer, the parent from the reader's chunks.
func (sc *servedChain) serve(ref string) {
	t := sc.t
	s, err := snapshot.Open(context.Background(), sc.store, ref, sc.ropts)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := s.ServeFile(snapshot.FileRAM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fr.Close() })
	f := layered(t, fr)
	var cfg configs.Config
	cfg.Snapshot.CacheDir = filepath.Join(sc.dir, "cache")
	ram := servedram.FromFile(f, filepath.Join(t.TempDir(), "ram.layer"), servedram.NewParent(sc.url(0), s, fr))
	sc.sb = &Sandbox{spec: Spec{ID: "sb", Pod: &specs.Spec{}, Node: testNode(t, cfg)}, mem: &servedMemory{ram: ram}}
	sc.file = f
}

// served is the sandbox's served RAM.
func (sc *servedChain) served() *servedram.RAM { return sc.sb.mem.(*servedMemory).ram }

// write is the guest writing pages (random content).
func (sc *servedChain) write(pages ...int64) {
	r := rand.New(rand.NewPCG(uint64(sc.gen), 9))
	buf := make([]byte, pagefs.PageSize)
	for _, pg := range pages {
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		copy(sc.ram[pg*pagefs.PageSize:], buf)
		if _, err := sc.file.WriteAt(buf, pg*pagefs.PageSize); err != nil {
			sc.t.Fatal(err)
		}
	}
}

// checkpoint seals the RAM and publishes it as the next generation; it
// checks that the snapshot reads back as the RAM.
func (sc *servedChain) checkpoint() snapshot.WriteStats {
	t := sc.t
	sc.gen++
	gen := sc.seal()
	devstate := filepath.Join(t.TempDir(), "devstate")
	if err := os.WriteFile(devstate, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	ref := "g" + itoa(sc.gen)
	c := &checkpointing{sb: sc.sb, store: sc.store, ref: ref, to: sc.url(sc.gen), wopts: sc.wopts,
		cap:   &capture{gen: gen, record: &sandboxRecord{}, pause: 23456789 * time.Nanosecond},
		paths: snapshot.SourcePaths{DevState: devstate, Spec: []byte("{}")}}
	if err := c.publish(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if c.cap.gen != nil {
		t.Error("publish left the generation open")
	}
	s, err := snapshot.Open(context.Background(), sc.store, ref, sc.ropts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What a controller reads to weigh the checkpoint.
	if d, ok := s.Metadata.PauseWindow(); !ok || d != 23457*time.Microsecond {
		t.Errorf("%s: pause window %v (%v), want 23.457ms", ref, d, ok)
	}
	chunks := c.res.Stats.UploadedBytes - s.Manifest.Config.Size - s.Descriptor.Size
	if up, ok := s.Metadata.UploadedBytes(); !ok || up != chunks {
		t.Errorf("%s: uploaded bytes %d (%v), the write pushed %d bytes of chunks", ref, up, ok, chunks)
	}
	got, err := s.ReadFile(context.Background(), snapshot.FileRAM, 1<<30)
	if err != nil || !bytes.Equal(got, sc.ram) {
		t.Fatalf("%s: ram read back differs (%v)", ref, err)
	}
	if p := sc.served().Parent(); p.Manifest != s.Descriptor.Digest || len(p.Chunks) != len(s.FileChunks(snapshot.FileRAM)) {
		t.Errorf("%s: the next parent is %s with %d chunks, want the new snapshot", ref, p.Manifest, len(p.Chunks))
	}
	return c.res.Stats
}

// seal is the RAM's part of the pause window, as the checkpoint's steps
// run it.
func (sc *servedChain) seal() *pagefs.Generation {
	sc.t.Helper()
	if err := sc.sb.mem.preSync(); err != nil {
		sc.t.Fatal(err)
	}
	if err := sc.sb.mem.sync(); err != nil {
		sc.t.Fatal(err)
	}
	c := &capture{}
	if err := sc.sb.mem.capture(c, false); err != nil {
		sc.t.Fatal(err)
	}
	return c.gen
}

// failTag is a store whose publish fails at its last step: every blob is
// uploaded, no tag points at them.
type failTag struct{ stores.Store }

func (failTag) Tag(context.Context, ocispec.Descriptor, string) error {
	return errors.New("tag refused")
}

// lostCheckpoint is a checkpoint that seals the RAM, uploads it while the
// guest writes pages during, and fails to tag it; the checkpoint's steps
// then undo it as Checkpoint does. The parent must stay the last snapshot
// published.
func (sc *servedChain) lostCheckpoint(during ...int64) {
	t := sc.t
	parent := sc.served().Parent().Manifest
	gen := sc.seal()
	sc.write(during...)
	devstate := filepath.Join(t.TempDir(), "devstate")
	if err := os.WriteFile(devstate, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &checkpointing{sb: sc.sb, store: failTag{sc.store}, ref: "lost", to: sc.url(99), wopts: sc.wopts,
		cap:   &capture{gen: gen, record: &sandboxRecord{}},
		paths: snapshot.SourcePaths{DevState: devstate, Spec: []byte("{}")}}
	if err := c.publish(context.Background(), nil); err == nil {
		t.Fatal("a publish whose tag fails succeeded")
	}
	sc.sb.mem.lost(context.Background(), c.cap)
	c.cap.cleanup()
	if p := sc.served().Parent().Manifest; p != parent {
		t.Errorf("after a lost checkpoint the parent is %s, want the last published %s", p, parent)
	}
}

// TestServedCheckpointIsIncremental: a served sandbox checkpoints as its
// parent plus what the guest wrote, twice without a restore and once
// after one; after a checkpoint that failed once uploaded (twice in a
// row), the next is incremental against the last snapshot published and
// holds the lost ones' pages and those written during their uploads.
func TestServedCheckpointIsIncremental(t *testing.T) {
	for _, key := range [][]byte{nil, bytes.Repeat([]byte{3}, 32)} {
		sc := newServedChain(t, key)
		sc.wopts.ChunkSize = 0 // the node's default (4 MiB): the chain keeps its parent's
		parentChunks := len(sc.served().Parent().Chunks)
		sc.write(1, 2, 3, 16*16+1) // chunks 0 and 16
		st := sc.checkpoint()
		if st.Reused != parentChunks-2 || st.Deltas != 2 || st.ParentMissing != 0 {
			t.Errorf("first checkpoint: %d reused of %d, %d deltas, %d without parent", st.Reused, parentChunks, st.Deltas, st.ParentMissing)
		}
		if st.UploadedBytes > 64<<10 {
			t.Errorf("first checkpoint uploaded %d bytes for 4 pages", st.UploadedBytes)
		}
		// Again, without a restore: the dirty set is what was written since.
		sc.write(5)
		st = sc.checkpoint()
		if st.Deltas != 2 || st.UploadedBytes > 64<<10 {
			t.Errorf("second checkpoint: %d deltas, %d bytes uploaded", st.Deltas, st.UploadedBytes)
		}
		// A restore of it, a write, a checkpoint.
		sc.serve("g02")
		sc.write(2*16 + 3) // a zero chunk of the parent
		st = sc.checkpoint()
		if st.Reused != len(sc.served().Parent().Chunks)-1 || st.ParentMissing != 0 {
			t.Errorf("checkpoint after a restore: %d reused, %d without parent", st.Reused, st.ParentMissing)
		}
		// Checkpoints fail after their upload: the next one writes the
		// chunks changed since g03, and reads back as the RAM (checkpoint).
		parentChunks = len(sc.served().Parent().Chunks)
		sc.write(7)                 // chunk 0
		sc.lostCheckpoint(9*16 + 1) // chunk 9, written during the upload
		sc.write(13 * 16)           // chunk 13
		sc.lostCheckpoint()
		sc.write(30*16 + 5) // chunk 30
		st = sc.checkpoint()
		if st.Reused != parentChunks-4 || st.ParentMissing != 0 {
			t.Errorf("after lost checkpoints: %d reused of %d, %d full chunks; want all but the 4 chunks written since g03", st.Reused, parentChunks, st.ParentMissing)
		}
		if st.UploadedBytes > 128<<10 {
			t.Errorf("after lost checkpoints: %d bytes uploaded for 4 pages", st.UploadedBytes)
		}
	}
}

// TestServedCheckpointAfterKeyRotation: the namespace key is rotated while
// a served sandbox runs; its checkpoint is sealed with the new key only
// (the parent's chunks, sealed with the old key, are not reused under the
// new key's ID) and restores with the new key; the next one is
// incremental again.
func TestServedCheckpointAfterKeyRotation(t *testing.T) {
	sc := newServedChain(t, bytes.Repeat([]byte{3}, 32))
	rotated := bytes.Repeat([]byte{4}, 32)
	sc.wopts.EncryptionKey, sc.ropts.DecryptionKey = rotated, rotated
	sc.write(1)
	st := sc.checkpoint() // verifies and reads back every chunk with the new key
	if st.Reused != 0 {
		t.Errorf("checkpoint after rotation reused %d chunks sealed with the old key", st.Reused)
	}
	sc.write(5)
	if st = sc.checkpoint(); st.Reused == 0 {
		t.Errorf("checkpoint after that: %d reused, want the rotated parent's chunks", st.Reused)
	}
}
