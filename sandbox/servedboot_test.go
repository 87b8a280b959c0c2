package sandbox

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/sandbox/servedram"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// newBootedChain is a booted sandbox whose RAM is served from zeros
// ([memory] booted = "served"): no snapshot behind it.
func newBootedChain(t *testing.T, key []byte) *servedChain {
	dir := t.TempDir()
	sc := &servedChain{t: t, dir: dir, ram: make([]byte, 40*servedCS)}
	sc.wopts = snapshot.WriteOptions{ChunkSize: servedCS, EncryptionKey: key}
	sc.ropts = snapshot.ReadOptions{DecryptionKey: key}
	var err error
	sc.store, _, err = stores.Open(context.Background(), sc.url(0), stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	sc.file = layered(t, bytesSource{bytes.NewReader(make([]byte, len(sc.ram)))})
	var cfg configs.Config
	cfg.Snapshot.CacheDir = filepath.Join(dir, "cache")
	ram := servedram.FromFile(sc.file, filepath.Join(t.TempDir(), "ram.layer"), servedram.Parent{Zero: true})
	sc.sb = &Sandbox{spec: Spec{ID: "sb", Pod: &specs.Spec{}, Node: testNode(t, cfg)}, mem: &servedMemory{ram: ram, booted: true}}
	return sc
}

// TestBootedServedCheckpoint: the first checkpoint of a booted sandbox
// whose RAM is served from zeros stores the chunks the guest wrote, full,
// and no other (the rest is zero); it reads back as the RAM, restores as
// any snapshot, and the next checkpoint is incremental against it. An
// encrypted write whose lineage is chosen as it runs reads the RAM whole
// instead: the same snapshot, the zero chunks still skipped.
func TestBootedServedCheckpoint(t *testing.T) {
	for _, key := range [][]byte{nil, bytes.Repeat([]byte{3}, 32)} {
		sc := newBootedChain(t, key)
		sc.write(1, 2, 3, 16*16+1) // chunks 0 and 16 of 40
		st := sc.checkpoint()      // checks the snapshot reads back as the RAM
		if n := len(sc.served().Parent().Chunks); n != 2 {
			t.Errorf("key %v: first checkpoint stored %d ram chunks, want the 2 written", key != nil, n)
		}
		if st.Reused != 0 || st.Deltas != 0 || st.ParentMissing != 0 {
			t.Errorf("key %v: first checkpoint %d reused, %d deltas, %d without parent; want full chunks against zeros", key != nil, st.Reused, st.Deltas, st.ParentMissing)
		}
		if key == nil && st.DirtyBytes != 4*4096 {
			t.Errorf("first checkpoint: %d dirty bytes, want the 4 pages", st.DirtyBytes)
		}
		sc.write(5)
		st = sc.checkpoint()
		if st.Reused != 1 || st.Deltas != 1 || st.UploadedBytes > 64<<10 {
			t.Errorf("key %v: second checkpoint %d reused, %d deltas, %d bytes uploaded; want it incremental", key != nil, st.Reused, st.Deltas, st.UploadedBytes)
		}
		// The snapshot restores lazily as a restored sandbox's does.
		sc.serve("g02")
		sc.write(30 * 16)
		if st = sc.checkpoint(); st.Reused != 2 || st.ParentMissing != 0 {
			t.Errorf("key %v: checkpoint after a restore: %d reused, %d without parent", key != nil, st.Reused, st.ParentMissing)
		}
	}
}
