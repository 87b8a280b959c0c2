package snapshot

import (
	"maps"
	"testing"
	"time"
)

// TestAnnotateUploaded: the metadata says what each write pushed, the
// chunks the store did not have: all of them the first time, none when
// the same files are written again; the caller's annotations are kept and
// not changed.
func TestAnnotateUploaded(t *testing.T) {
	ts := newTestSnap(t)
	ts.md.Annotations = map[string]string{AnnotationPauseWindow: "23.4ms", "k": "v"}
	before := maps.Clone(ts.md.Annotations)
	store := newMemStore()

	pushed := store.pushedBytes.Load()
	first, _ := ts.write(t, store, "v1", WriteOptions{AnnotateUploaded: true})
	s := open(t, store, "v1", ReadOptions{})
	cfgAndManifest := s.Manifest.Config.Size + s.Descriptor.Size
	up, ok := s.Metadata.UploadedBytes()
	if !ok || up != store.pushedBytes.Load()-pushed-cfgAndManifest || up != first.UploadedBytes-cfgAndManifest {
		t.Errorf("first write: annotation %d (%v), store received %d bytes of chunks", up, ok, store.pushedBytes.Load()-pushed-cfgAndManifest)
	}
	if d, ok := s.Metadata.PauseWindow(); !ok || d != 23400*time.Microsecond || s.Metadata.Annotations["k"] != "v" {
		t.Errorf("annotations %v: the caller's are lost", s.Metadata.Annotations)
	}
	if !maps.Equal(ts.md.Annotations, before) {
		t.Errorf("write changed the caller's annotations to %v", ts.md.Annotations)
	}

	ts.write(t, store, "v2", WriteOptions{AnnotateUploaded: true})
	if up, ok := open(t, store, "v2", ReadOptions{}).Metadata.UploadedBytes(); !ok || up != 0 {
		t.Errorf("second write of the same files: annotation %d (%v), want 0", up, ok)
	}

	ts.md.Annotations = nil
	ts.write(t, store, "v3", WriteOptions{})
	md := open(t, store, "v3", ReadOptions{}).Metadata
	if _, ok := md.UploadedBytes(); ok {
		t.Errorf("written without AnnotateUploaded: annotations %v", md.Annotations)
	}
	if _, ok := md.PauseWindow(); ok {
		t.Errorf("no pause window recorded: annotations %v", md.Annotations)
	}
}
