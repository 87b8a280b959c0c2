package sandbox

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// TestFetchDevState: a lazy restore streams its device state, verified, to
// <stateDir>/devstate.in, and refuses one over [restore]
// max_device_state (naming it) before writing anything; the file goes
// when the restore's steps end.
func TestFetchDevState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	url := "file://" + filepath.Join(dir, "store") + ":v1"
	store, _, err := stores.Open(ctx, url, stores.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	ds := make([]byte, 3<<20/2) // 1.5 MiB, a hole in its middle
	r := rand.New(rand.NewPCG(3, 4))
	for i := range ds {
		if i < 512<<10 || i >= 1<<20 {
			ds[i] = byte(r.Uint32())
		}
	}
	src := &snapshot.Source{Files: []snapshot.SourceFile{
		snapshot.BytesSourceFile(snapshot.FileRAM, make([]byte, 1<<20)),
		snapshot.BytesSourceFile(snapshot.FileDevState, ds),
	}}
	if _, _, err := snapshot.Write(ctx, store, "v1", src, snapshot.WriteOptions{ChunkSize: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Open(ctx, store, "v1", snapshot.ReadOptions{MaxMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		limitMiB int64
		refused  bool
	}{
		{"over max_device_state", 1, true},
		{"within max_device_state", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configs.Default()
			cfg.Restore.MaxDeviceStateMiB = tc.limitMiB
			stateDir := t.TempDir()
			st := &start{Spec: Spec{ID: "sb", Node: testNode(t, cfg), StateDir: stateDir}, src: Source{URL: url}, restore: &restoring{snap: s}}
			u := &undo{}
			path, err := st.fetchDevState(ctx, u)
			if tc.refused {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "restore.max_device_state") {
					t.Fatalf("fetchDevState: %v, want a refusal naming restore.max_device_state", err)
				}
				if ents, _ := os.ReadDir(stateDir); len(ents) != 0 {
					t.Fatalf("a refused device state left %v", ents)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, ds) {
				t.Fatalf("device state: %d bytes, %v; want the %d bytes written", len(got), err, len(ds))
			}
			u.unwind(ctx, false)
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("device state left after the steps: %v", err)
			}
		})
	}
}
