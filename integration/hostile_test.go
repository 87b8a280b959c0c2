//go:build integration

package integration

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
)

// TestRestoreHostileRecord: a real snapshot, re-published in its file
// store by someone who can write the store (no signature is required by
// default) with hostile sandbox record or metadata fields, is refused
// before anything is created outside the shim's own directories; the
// unedited snapshot still restores.
func TestRestoreHostileRecord(t *testing.T) {
	e := harness.Start(t)
	before := startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("rec:v1"))
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")
	layout := filepath.Join(e.Dir, "store", "rec")
	maxVCPUs := e.Cfg.Hypervisor.MaxVCPUs
	// The shim's own directories exist before the first restore, so that
	// the listings below see what a restore creates inside them.
	for _, d := range []string{e.Cfg.Snapshot.CacheDir, nodecache.SnapshotsDir(e.Cfg.Snapshot.CacheDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}

	type recEdit func(rec map[string]any)
	disk0 := func(rec map[string]any) map[string]any { return rec["disks"].([]any)[0].(map[string]any) }
	ctr0 := func(rec map[string]any) map[string]any { return rec["containers"].([]any)[0].(map[string]any) }
	for _, tc := range []struct {
		name string
		rec  recEdit
		md   func(md *snapshot.Metadata)
		want string
	}{
		// Each escape would land in e.Dir: the disk dir is <Dir>/disks/<sandbox>.
		{name: "disk id escapes", rec: func(r map[string]any) { disk0(r)["id"] = "../../escaped-disk" }, want: "disks[0].id"},
		{name: "disk name escapes", rec: func(r map[string]any) { disk0(r)["name"] = "../../escaped-name" }, want: "disks[0].name"},
		{name: "container disk escapes", rec: func(r map[string]any) { ctr0(r)["disk"] = "../../escaped-workdir" }, want: "containers[0].disk"},
		{name: "guest id with a slash", rec: func(r map[string]any) { ctr0(r)["guestID"] = "a/../../b" }, want: "containers[0].guestID"},
		{name: "record vcpus over max_vcpus", rec: func(r map[string]any) {
			r["vcpus"] = maxVCPUs + 1
		}, want: "max_vcpus"},
		{name: "metadata vcpus over max_vcpus", md: func(md *snapshot.Metadata) { md.Fingerprint.VCPUs = maxVCPUs + 1 }, want: "fingerprint.vcpus"},
		{name: "metadata memory over max_memory", md: func(md *snapshot.Metadata) { md.Fingerprint.MemoryMiB = 1 << 20 }, want: "fingerprint.memoryMiB"},
		// A disk claiming 4 TiB (a few KiB stored): the shim once allocated
		// per chunk of that logical size, ~12 GiB for 25 such disks.
		{name: "disk over max_disk_size", md: func(md *snapshot.Metadata) {
			n := 0
			for k := range md.Files {
				if strings.HasPrefix(md.Files[k].Name, "disk:") {
					md.Files[k].Size, n = 4<<40, n+1
				}
			}
			if n == 0 {
				t.Fatal("setup: the snapshot has no disk")
			}
		}, want: "max_disk_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := strings.ReplaceAll(tc.name, " ", "-")
			republish(t, layout, "v1", tag, tc.rec, tc.md)
			watched := []string{e.Dir, e.Cfg.Runtime.DiskRoot, e.StateRoot, nodecache.SnapshotsDir(e.Cfg.Snapshot.CacheDir), e.MemoryDir}
			fsBefore := listing(t, watched)
			id := "h-" + tag
			_, errs, err := e.Ctr(e.RunArgs("-d", "--annotation", "cryo.dev/restore-from="+e.StoreURL("rec:"+tag), harness.Image, id, "true")...)
			if err == nil {
				t.Fatalf("the hostile snapshot restored")
			}
			e.MustCtr("c", "rm", id)
			if fsAfter := listing(t, watched); !slices.Equal(fsBefore, fsAfter) {
				t.Fatalf("the refused restore changed the filesystem:\nbefore %v\nafter  %v", fsBefore, fsAfter)
			}
			if !strings.Contains(errs, tc.want) {
				t.Fatalf("error does not name %s:\n%s", tc.want, errs)
			}
			t.Logf("refused: %s", strings.TrimSpace(errs))
			noLeftovers(t, e)
			noDisks(t, e)
		})
	}

	restore(t, e, "ok", e.StoreURL("rec:v1"))
	if after := readState(t, e, "ok"); after.bootID != before.bootID || after.secret != before.secret {
		t.Fatalf("restored state %+v, checkpointed %+v", after, before)
	}
}

// listing lists the entries of the watched directories: every entry of the
// shim's directories, and the top level of the test's root (where an
// escape from the disk dir would land). The blob cache, the store and
// containerd's own files may change.
func listing(t *testing.T, dirs []string) []string {
	t.Helper()
	var out []string
	top, _ := os.ReadDir(dirs[0])
	for _, e := range top {
		out = append(out, filepath.Join(dirs[0], e.Name()))
	}
	for _, d := range dirs[1:] {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil {
				out = append(out, p)
			}
			return nil
		})
	}
	slices.Sort(out)
	return out
}

// republish tags as newTag, in the OCI layout of a file store, a copy of
// the snapshot tag with its sandbox record (the "spec" file, one plaintext
// chunk) and metadata edited, with correct digests throughout: what anyone
// who can write the store can do.
func republish(t *testing.T, layout, tag, newTag string, editRec func(map[string]any), editMD func(*snapshot.Metadata)) {
	t.Helper()
	blob := func(d digest.Digest) []byte {
		b, err := os.ReadFile(filepath.Join(layout, "blobs", "sha256", d.Encoded()))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	put := func(b []byte) (digest.Digest, int64) {
		d := digest.FromBytes(b)
		if err := os.WriteFile(filepath.Join(layout, "blobs", "sha256", d.Encoded()), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return d, int64(len(b))
	}
	unmarshal := func(b []byte, v any) {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	var idx ocispec.Index
	unmarshal(readFile(t, filepath.Join(layout, "index.json")), &idx)
	i := slices.IndexFunc(idx.Manifests, func(d ocispec.Descriptor) bool { return d.Annotations[ocispec.AnnotationRefName] == tag })
	if i < 0 {
		t.Fatalf("no tag %s in %s", tag, layout)
	}
	var m ocispec.Manifest
	unmarshal(blob(idx.Manifests[i].Digest), &m)
	var md snapshot.Metadata
	unmarshal(blob(m.Config.Digest), &md)
	if editRec != nil {
		l := slices.IndexFunc(m.Layers, func(d ocispec.Descriptor) bool { return d.Annotations[snapshot.AnnotationFile] == snapshot.FileSpec })
		if l < 0 || m.Layers[l].MediaType != snapshot.MediaTypeChunk {
			t.Fatalf("setup: the spec is not one plaintext chunk: %+v", m.Layers)
		}
		dec, _ := zstd.NewReader(nil)
		raw, err := dec.DecodeAll(blob(m.Layers[l].Digest), nil)
		dec.Close()
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		unmarshal(raw, &rec)
		editRec(rec)
		raw, _ = json.Marshal(rec)
		enc, _ := zstd.NewWriter(nil)
		m.Layers[l].Digest, m.Layers[l].Size = put(enc.EncodeAll(raw, nil))
		enc.Close()
		m.Layers[l].Annotations[snapshot.AnnotationSize] = strconv.Itoa(len(raw))
		for k := range md.Files {
			if md.Files[k].Name == snapshot.FileSpec {
				md.Files[k].Size = int64(len(raw))
			}
		}
	}
	if editMD != nil {
		editMD(&md)
	}
	cb, _ := json.Marshal(md)
	m.Config.Digest, m.Config.Size = put(cb)
	mb, _ := json.Marshal(m)
	d, n := put(mb)
	idx.Manifests = append(idx.Manifests, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: n,
		Annotations: map[string]string{ocispec.AnnotationRefName: newTag}})
	ib, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(layout, "index.json"), ib, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
