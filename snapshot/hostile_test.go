package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// rewrite re-publishes ref after fn edited its manifest and metadata, with
// correct digests: what a hostile publisher (not a corrupting store) does.
func rewrite(t testing.TB, store *memStore, ref string, fn func(m *ocispec.Manifest, md *Metadata)) {
	t.Helper()
	ctx := context.Background()
	desc, err := store.Resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(store.get(desc.Digest), &m); err != nil {
		t.Fatal(err)
	}
	var md Metadata
	if err := json.Unmarshal(store.get(m.Config.Digest), &md); err != nil {
		t.Fatal(err)
	}
	fn(&m, &md)
	cfg, _ := json.Marshal(md)
	m.Config = store.put(cfg)
	m.Config.MediaType = MediaTypeConfig
	mb, _ := json.Marshal(m)
	nd := store.put(mb)
	nd.MediaType = ocispec.MediaTypeImageManifest
	if err := store.Tag(ctx, nd, ref); err != nil {
		t.Fatal(err)
	}
}

// firstLayer returns the index of the first layer of file.
func firstLayer(t *testing.T, m *ocispec.Manifest, file string) int {
	for i, l := range m.Layers {
		if l.Annotations[AnnotationFile] == file {
			return i
		}
	}
	t.Fatalf("no layer of %s", file)
	return -1
}

// zstdFrame encodes raw with the streaming encoder (no content size in the
// header) and the given window.
func zstdFrame(t *testing.T, raw []byte, window int) []byte {
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithWindowSize(window), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(raw)
	enc.Close()
	return buf.Bytes()
}

// replaceChunk makes layer i of file point at a crafted, correctly digested
// blob.
func replaceChunk(t *testing.T, store *memStore, file string, stored []byte) func(*ocispec.Manifest, *Metadata) {
	return func(m *ocispec.Manifest, _ *Metadata) {
		i := firstLayer(t, m, file)
		d := store.put(stored)
		m.Layers[i].Digest, m.Layers[i].Size = d.Digest, d.Size
	}
}

// names returns a check that err is an invalid argument naming field.
func names(field string) func(error) bool {
	return func(err error) bool { return errdefs.IsInvalidArgument(err) && strings.Contains(err.Error(), field) }
}

func TestHostile(t *testing.T) {
	type phase int
	const (
		atOpen phase = iota
		atMaterialize
	)
	big := make([]byte, 64<<20) // decompresses from a few KiB
	cases := []struct {
		name  string
		setup func(t *testing.T, store *memStore, s *Snapshot)
		opts  ReadOptions
		phase phase
		want  func(error) bool
	}{
		{"flipped bit in chunk", func(t *testing.T, st *memStore, s *Snapshot) {
			st.corrupt(s.chunks[3].desc.Digest, func(b []byte) []byte { b[len(b)/2] ^= 1; return b })
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"flipped bit in manifest", func(t *testing.T, st *memStore, s *Snapshot) {
			st.corrupt(s.Descriptor.Digest, func(b []byte) []byte { b[100] ^= 1; return b })
		}, ReadOptions{}, atOpen, errdefs.IsDataLoss},
		{"flipped bit in config", func(t *testing.T, st *memStore, s *Snapshot) {
			st.corrupt(s.Manifest.Config.Digest, func(b []byte) []byte { b[10] ^= 4; return b })
		}, ReadOptions{}, atOpen, errdefs.IsDataLoss},
		{"truncated chunk", func(t *testing.T, st *memStore, s *Snapshot) {
			st.corrupt(s.chunks[0].desc.Digest, func(b []byte) []byte { return b[:len(b)-1] })
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"extra bytes after chunk", func(t *testing.T, st *memStore, s *Snapshot) {
			d := s.chunks[0].desc.Digest
			st.fetchHook = func(desc ocispec.Descriptor, off, n int64, b []byte) []byte {
				if desc.Digest == d {
					return append(b, 0)
				}
				return b
			}
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"extra bytes after manifest", func(t *testing.T, st *memStore, s *Snapshot) {
			st.fetchHook = func(desc ocispec.Descriptor, off, n int64, b []byte) []byte {
				if desc.Digest == s.Descriptor.Digest {
					return append(b, ' ')
				}
				return b
			}
		}, ReadOptions{}, atOpen, errdefs.IsDataLoss},
		{"zstd bomb, tiny input huge output", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", replaceChunk(t, st, FileDevState, zstdFrame(t, big, 32<<10)))
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"zstd bomb, content size in header", func(t *testing.T, st *memStore, s *Snapshot) {
			enc, _ := zstd.NewWriter(nil, zstd.WithWindowSize(32<<10), zstd.WithSingleSegment(false))
			rewrite(t, st, "v1", replaceChunk(t, st, FileDevState, enc.EncodeAll(big, nil)))
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"zstd huge window", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", replaceChunk(t, st, FileDevState, zstdFrame(t, bytes.Repeat([]byte("ab"), testCS), 256<<20)))
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"decompressed size smaller than manifest", func(t *testing.T, st *memStore, s *Snapshot) {
			enc, _ := zstd.NewWriter(nil)
			rewrite(t, st, "v1", replaceChunk(t, st, FileDevState, enc.EncodeAll(bytes.Repeat([]byte{1}, testCS-1), nil)))
		}, ReadOptions{}, atMaterialize, errdefs.IsDataLoss},
		{"chunk offset outside the file", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				m.Layers[firstLayer(t, m, "disk:root")].Annotations[AnnotationOffset] = strconv.Itoa(10 * testCS)
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"chunk offsets overlap", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				i := firstLayer(t, m, "disk:root")
				m.Layers[i+1].Annotations = m.Layers[i].Annotations
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"chunk offset unaligned", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				m.Layers[firstLayer(t, m, "disk:root")].Annotations[AnnotationOffset] = "4096"
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"raw size over chunk size", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				m.Layers[firstLayer(t, m, "disk:root")].Annotations[AnnotationSize] = strconv.Itoa(testCS + 1)
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"negative offset", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				m.Layers[0].Annotations[AnnotationOffset] = "-65536"
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"file name escapes the cache", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Files[1].Name = "disk:../../etc"
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"layer digest without an algorithm", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { m.Layers[0].Digest = "0123" })
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"chunk of an unknown file", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				m.Layers[0].Annotations[AnnotationFile] = "disk:other"
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"unknown format version", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.FormatVersion = FormatVersion + 1 })
		}, ReadOptions{}, atOpen, errdefs.IsNotImplemented},
		{"wrong artifact type", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { m.ArtifactType = "application/vnd.other" })
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"plaintext chunk in encrypted snapshot", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Encryption = &Encryption{Algorithm: algAES256GCM, KeyID: KeyID(bytes.Repeat([]byte{1}, 32))}
			})
		}, ReadOptions{}, atOpen, errdefs.IsInvalidArgument},
		{"too many layers", nil, ReadOptions{MaxLayers: 10}, atOpen, errdefs.IsInvalidArgument},
		{"manifest annotation with an escape", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { m.Annotations = map[string]string{"note": "\x1b]0;owned\a"} })
		}, ReadOptions{}, atOpen, names("manifest.annotations[note]")},
		{"vcpus over the node's limit", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Fingerprint.VCPUs = 64 })
		}, ReadOptions{MaxVCPUs: 8}, atOpen, names("fingerprint.vcpus")},
		{"memory over the node's limit", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Fingerprint.MemoryMiB = 1 << 20 })
		}, ReadOptions{MaxMemoryMiB: 16384}, atOpen, names("fingerprint.memoryMiB")},
		{"ram file over the node's memory", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Fingerprint.MemoryMiB = 1 })
		}, ReadOptions{MaxMemoryMiB: 1}, atOpen, names("files[ram].size")},
		{"spec file over its cap", nil, ReadOptions{MaxSpecSize: 8}, atOpen, names("files[spec].size")},
		{"too many files", nil, ReadOptions{MaxFiles: 3}, atOpen, names("files:")},
		{"container id with a slash", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Containers[0].ID = "../c1" })
		}, ReadOptions{}, atOpen, names("containers[0].id")},
		{"container id with NUL", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Containers[0].ID = "c\x001" })
		}, ReadOptions{}, atOpen, names("containers[0].id")},
		{"too many containers", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Containers = make([]Container, maxContainers+1) })
		}, ReadOptions{}, atOpen, names("containers:")},
		{"container image with an escape", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Containers[0].Image = "busybox\x1b[2J" })
		}, ReadOptions{}, atOpen, names("containers[0].image")},
		{"container layer chain digest", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Containers[0].LayerChain = []digest.Digest{"sha256:../../x"}
			})
		}, ReadOptions{}, atOpen, names("containers[0].layerChain")},
		{"container spec over its cap", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Containers[0].Spec = json.RawMessage(`"` + strings.Repeat("x", 64) + `"`)
			})
		}, ReadOptions{MaxSpecSize: 32}, atOpen, names("containers[0].spec")},
		{"hostname", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Network.Hostname = "web/../x" })
		}, ReadOptions{}, atOpen, names("network.hostname")},
		{"interface name", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Network.Interfaces[0].Name = "eth0/x" })
		}, ReadOptions{}, atOpen, names("network.interfaces[0].name")},
		{"interface mac", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Network.Interfaces[0].MAC = "zz" })
		}, ReadOptions{}, atOpen, names("network.interfaces[0].mac")},
		{"interface address", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Network.Interfaces[0].Addresses = []string{"10.0.0.2"} })
		}, ReadOptions{}, atOpen, names("network.interfaces[0].addresses")},
		{"dns server", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Network.DNS = []string{"ns1;rm"} })
		}, ReadOptions{}, atOpen, names("network.dns")},
		{"source with a newline", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Source.PodName = "web\nFAKE LOG LINE" })
		}, ReadOptions{}, atOpen, names("source.podName")},
		{"source too long", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Source.Node = strings.Repeat("n", 257) })
		}, ReadOptions{}, atOpen, names("source.node")},
		{"working set index past the ram file", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.WorkingSet = []int64{0, 1 << 40} })
		}, ReadOptions{}, atOpen, names("workingSet[1]")},
		{"working set index twice", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.WorkingSet = []int64{1, 0, 1} })
		}, ReadOptions{}, atOpen, names("workingSet[2]")},
		{"working set negative", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.WorkingSet = []int64{-1} })
		}, ReadOptions{}, atOpen, names("workingSet[0]")},
		{"annotation value with NUL", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Annotations = map[string]string{"k": "v\x00"} })
		}, ReadOptions{}, atOpen, names("annotations[k]")},
		{"pause window not a duration", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Annotations = map[string]string{AnnotationPauseWindow: "23"}
			})
		}, ReadOptions{}, atOpen, names("annotations[" + AnnotationPauseWindow + "]")},
		{"pause window negative", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Annotations = map[string]string{AnnotationPauseWindow: "-1ms"}
			})
		}, ReadOptions{}, atOpen, names("annotations[" + AnnotationPauseWindow + "]")},
		{"uploaded bytes not a decimal", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Annotations = map[string]string{AnnotationUploadedBytes: "0x10"}
			})
		}, ReadOptions{}, atOpen, names("annotations[" + AnnotationUploadedBytes + "]")},
		{"uploaded bytes above stored", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Annotations = map[string]string{AnnotationUploadedBytes: strconv.FormatInt(md.Totals.StoredBytes+1, 10)}
			})
		}, ReadOptions{}, atOpen, names("annotations[" + AnnotationUploadedBytes + "]")},
		{"fingerprint device", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) {
				md.Fingerprint.Devices = []fingerprint.Device{{ID: strings.Repeat("d", 129)}}
			})
		}, ReadOptions{}, atOpen, names("fingerprint.devices[0].id")},
		{"negative vcpus", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Fingerprint.VCPUs = -1 })
		}, ReadOptions{}, atOpen, names("fingerprint.vcpus")},
		{"negative totals", func(t *testing.T, st *memStore, s *Snapshot) {
			rewrite(t, st, "v1", func(m *ocispec.Manifest, md *Metadata) { md.Totals.Chunks = -1 })
		}, ReadOptions{}, atOpen, names("totals")},
		{"config over the limit", nil, ReadOptions{MaxConfigSize: 100}, atOpen, errdefs.IsInvalidArgument},
		{"chunk changes between two ranged reads", func(t *testing.T, st *memStore, s *Snapshot) {
			d := s.chunks[0].desc.Digest
			var once sync.Once
			st.fetchHook = func(desc ocispec.Descriptor, off, n int64, b []byte) []byte {
				if desc.Digest == d && off > 0 {
					once.Do(func() { st.corrupt(d, func(b []byte) []byte { b[len(b)-1] ^= 1; return b }) })
				}
				return b
			}
		}, ReadOptions{RangeSize: 4096}, atMaterialize, errdefs.IsDataLoss},
		{"disk full", func(t *testing.T, st *memStore, s *Snapshot) {}, ReadOptions{}, atMaterialize,
			func(err error) bool { return errors.Is(err, syscall.ENOSPC) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			ts.write(t, store, "v1", WriteOptions{})
			s := open(t, store, "v1", ReadOptions{})
			if tc.setup != nil {
				tc.setup(t, store, s)
			}
			parent := t.TempDir()
			cache := parent + "/cache"
			s, err := Open(context.Background(), store, "v1", tc.opts)
			if tc.phase == atOpen {
				if err == nil || !tc.want(err) {
					t.Fatalf("open: got %v", err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if tc.name == "disk full" {
				var n int
				var mu sync.Mutex
				s.writeAt = func(f writerAt, b []byte, off int64) (int, error) {
					mu.Lock()
					defer mu.Unlock()
					if n++; n > 5 {
						return 0, syscall.ENOSPC
					}
					return f.WriteAt(b, off)
				}
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			m, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache))
			runtime.ReadMemStats(&after)
			if err == nil || !tc.want(err) {
				t.Fatalf("materialize: got %+v, %v", m, err)
			}
			// A bomb must not be decoded: 64 MiB would show here.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
				t.Errorf("materialize allocated %d MiB", alloc>>20)
			}
			t.Logf("refused: %v", err)
			assertEmptyCache(t, cache)
			assertOnly(t, parent, "cache")
		})
	}
}

// assertOnly fails unless dir holds exactly the named entries.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := readDirNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(names) {
		t.Fatalf("%s holds %v, want %v", dir, ents, names)
	}
	for i := range names {
		if ents[i] != names[i] {
			t.Fatalf("%s holds %v, want %v", dir, ents, names)
		}
	}
}

// deltaLayers returns the indexes of m's delta layers and a map from
// digest to the index of each base layer.
func deltaLayers(m *ocispec.Manifest) (deltas []int, bases map[string]int) {
	bases = map[string]int{}
	for i, l := range m.Layers {
		switch {
		case l.Annotations[AnnotationBase] != "":
			deltas = append(deltas, i)
		case l.Annotations[AnnotationRole] != "":
			bases[l.Digest.String()] = i
		}
	}
	return deltas, bases
}

// craftDelta makes the delta layer of file at off point at a plaintext
// delta with the given payload: sum (nil: the right one), bitmap, pages.
func craftDelta(t *testing.T, store *memStore, ts *testSnap, file string, off int64, sum, bitmap []byte, pages int) func(*ocispec.Manifest, *Metadata) {
	return func(m *ocispec.Manifest, _ *Metadata) {
		for i, l := range m.Layers {
			if l.Annotations[AnnotationFile] != file || l.Annotations[AnnotationOffset] != strconv.FormatInt(off, 10) {
				continue
			}
			size, _ := strconv.ParseInt(l.Annotations[AnnotationSize], 10, 64)
			raw := make([]byte, size)
			f, _ := os.Open(ts.paths.DevState)
			f.ReadAt(raw, off)
			f.Close()
			if sum == nil {
				s := sha256.Sum256(raw)
				sum = s[:]
			}
			p := append(append(append([]byte(nil), sum...), bitmap...), bytes.Repeat([]byte{0xa5}, pages*PageSize)...)
			d := store.put(zstdFrame(t, p, 32<<10))
			m.Layers[i].Digest, m.Layers[i].Size = d.Digest, d.Size
			return
		}
		t.Fatalf("no layer of %s at %d", file, off)
	}
}

// TestHostileDelta: manifests and delta payloads that a writer never
// makes are refused with a clear error, before anything is written when
// the manifest tells, and leaving nothing behind when only the bytes do.
func TestHostileDelta(t *testing.T) {
	type phase int
	const (
		atOpen phase = iota
		atMaterialize
	)
	devLast := int64(4 * testCS) // devstate's last chunk: 11 pages
	edit := func(fn func(t *testing.T, m *ocispec.Manifest, md *Metadata, deltas []int, bases map[string]int)) func(*testing.T, *memStore, *testSnap) {
		return func(t *testing.T, st *memStore, _ *testSnap) {
			rewrite(t, st, "v2", func(m *ocispec.Manifest, md *Metadata) {
				deltas, bases := deltaLayers(m)
				if len(deltas) < 2 || len(bases) < 2 {
					t.Fatalf("setup: %d deltas, %d bases", len(deltas), len(bases))
				}
				fn(t, m, md, deltas, bases)
			})
		}
	}
	baseOf := func(m *ocispec.Manifest, bases map[string]int, delta int) int {
		return bases[m.Layers[delta].Annotations[AnnotationBase]]
	}
	cases := []struct {
		name  string
		enc   bool
		setup func(t *testing.T, st *memStore, ts *testSnap)
		phase phase
		want  func(error) bool
	}{
		{"delta's base missing from the manifest", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			i := baseOf(m, b, d[0])
			m.Layers = append(m.Layers[:i], m.Layers[i+1:]...)
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta's base is a delta", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].Annotations[AnnotationBase] = m.Layers[d[1]].Digest.String()
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta's base is a placed full chunk", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].Annotations[AnnotationBase] = m.Layers[firstLayer(t, m, "disk:root")].Digest.String()
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta without a base", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			delete(m.Layers[d[0]].Annotations, AnnotationBase)
			m.Layers[d[0]].Annotations[AnnotationRole+"x"] = "" // keep it a delta by media type
		}), atOpen, errdefs.IsInvalidArgument},
		{"base of the wrong size", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[baseOf(m, b, d[0])].Annotations[AnnotationSize] = "4096"
		}), atOpen, errdefs.IsInvalidArgument},
		{"base over the chunk size", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[baseOf(m, b, d[0])].Annotations[AnnotationSize] = strconv.Itoa(testCS + 1)
		}), atOpen, errdefs.IsInvalidArgument},
		{"base layer with a delta media type", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[baseOf(m, b, d[0])].MediaType = MediaTypeDelta
		}), atOpen, errdefs.IsInvalidArgument},
		{"base layer with an offset", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			l := m.Layers[baseOf(m, b, d[0])]
			l.Annotations[AnnotationFile], l.Annotations[AnnotationOffset] = FileRAM, "0"
		}), atOpen, errdefs.IsInvalidArgument},
		{"base layer with another role", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[baseOf(m, b, d[0])].Annotations[AnnotationRole] = "placed"
		}), atOpen, errdefs.IsInvalidArgument},
		{"base listed twice", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers = append(m.Layers, m.Layers[baseOf(m, b, d[0])])
		}), atOpen, errdefs.IsInvalidArgument},
		{"base used by no delta", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			l := m.Layers[firstLayer(t, m, "disk:root")]
			m.Layers = append(m.Layers, ocispec.Descriptor{MediaType: l.MediaType, Digest: l.Digest, Size: l.Size,
				Annotations: map[string]string{AnnotationRole: RoleBase, AnnotationSize: l.Annotations[AnnotationSize]}})
		}), atOpen, errdefs.IsInvalidArgument},
		{"two deltas at one offset", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[1]].Annotations[AnnotationFile] = m.Layers[d[0]].Annotations[AnnotationFile]
			m.Layers[d[1]].Annotations[AnnotationOffset] = m.Layers[d[0]].Annotations[AnnotationOffset]
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta over a full chunk's offset", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].Annotations[AnnotationOffset] = strconv.Itoa(10 * testCS) // RAM chunk 10 is full
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta outside the file", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].Annotations[AnnotationOffset] = strconv.Itoa(100 * testCS)
		}), atOpen, errdefs.IsInvalidArgument},
		{"delta in a version 1 snapshot", false, edit(func(t *testing.T, m *ocispec.Manifest, md *Metadata, d []int, b map[string]int) {
			md.FormatVersion = FormatVersionNoDelta
		}), atOpen, errdefs.IsInvalidArgument},
		{"full chunk with a base annotation", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[firstLayer(t, m, "disk:root")].Annotations[AnnotationBase] = m.Layers[baseOf(m, b, d[0])].Digest.String()
		}), atOpen, errdefs.IsInvalidArgument},
		{"plaintext delta in an encrypted snapshot", true, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].MediaType = MediaTypeDelta
		}), atOpen, errdefs.IsInvalidArgument},
		{"encrypted base shared by two deltas", true, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			i := baseOf(m, b, d[1])
			m.Layers[baseOf(m, b, d[0])].Annotations[AnnotationSize] = m.Layers[i].Annotations[AnnotationSize]
			m.Layers[d[1]].Annotations[AnnotationBase] = m.Layers[d[0]].Annotations[AnnotationBase]
			m.Layers = append(m.Layers[:i], m.Layers[i+1:]...)
		}), atOpen, errdefs.IsInvalidArgument},
		{"bitmap beyond the chunk", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, nil, []byte{0, 0x10}, 1))
		}, atMaterialize, errdefs.IsDataLoss},
		{"bitmap names more pages than the delta holds", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, nil, []byte{3, 0}, 1))
		}, atMaterialize, errdefs.IsDataLoss},
		{"delta holds more pages than its bitmap names", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, nil, []byte{1, 0}, 2))
		}, atMaterialize, errdefs.IsDataLoss},
		{"delta holds no page", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, nil, []byte{0, 0}, 0))
		}, atMaterialize, errdefs.IsDataLoss},
		{"delta larger than its chunk", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, nil, []byte{0xff, 0x07}, 11))
		}, atMaterialize, errdefs.IsDataLoss},
		{"rebuilt chunk differs from what the writer read", false, func(t *testing.T, st *memStore, ts *testSnap) {
			rewrite(t, st, "v2", craftDelta(t, st, ts, FileDevState, devLast, make([]byte, 32), []byte{2, 0}, 1))
		}, atMaterialize, errdefs.IsDataLoss},
		{"delta bytes flipped in the store", false, func(t *testing.T, st *memStore, ts *testSnap) {
			m := manifestOf(t, st, "v2")
			d, _ := deltaLayers(&m)
			st.corrupt(m.Layers[d[0]].Digest, func(b []byte) []byte { b[len(b)/2] ^= 1; return b })
		}, atMaterialize, errdefs.IsDataLoss},
		{"delta applied to another base of its size", false, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			// RAM chunks 0 and 1 are both full-size: swap their bases.
			m.Layers[d[0]].Annotations[AnnotationBase], m.Layers[d[1]].Annotations[AnnotationBase] =
				m.Layers[d[1]].Annotations[AnnotationBase], m.Layers[d[0]].Annotations[AnnotationBase]
		}), atMaterialize, errdefs.IsDataLoss},
		{"encrypted delta moved to another offset", true, edit(func(t *testing.T, m *ocispec.Manifest, _ *Metadata, d []int, b map[string]int) {
			m.Layers[d[0]].Annotations[AnnotationOffset], m.Layers[d[1]].Annotations[AnnotationOffset] =
				m.Layers[d[1]].Annotations[AnnotationOffset], m.Layers[d[0]].Annotations[AnnotationOffset]
		}), atMaterialize, errdefs.IsDataLoss},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestSnap(t)
			store := newMemStore()
			var opts WriteOptions
			var ropts ReadOptions
			if tc.enc {
				opts.EncryptionKey = bytes.Repeat([]byte{9}, 32)
				ropts.DecryptionKey = opts.EncryptionKey
			}
			deltaSetup(t, ts, store, opts)
			tc.setup(t, store, ts)
			parent := t.TempDir()
			cache := parent + "/cache"
			s, err := Open(context.Background(), store, "v2", ropts)
			if tc.phase == atOpen {
				if err == nil || !tc.want(err) {
					t.Fatalf("open: got %v", err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			m, err := s.Materialize(context.Background(), nodecache.OpenSnapshots(cache))
			if err == nil || !tc.want(err) {
				t.Fatalf("materialize: got %+v, %v", m, err)
			}
			t.Logf("refused: %v", err)
			assertEmptyCache(t, cache)
			assertOnly(t, parent, "cache")
		})
	}
}
