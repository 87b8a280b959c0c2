package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/internal/safefs"
	"github.com/cryo-runtime/cryo/sandbox"
	"github.com/cryo-runtime/cryo/stores"
)

func TestTaskCheckpointRequestNoStore(t *testing.T) {
	r := &taskAPI.CheckpointTaskRequest{ID: "c", Path: "/var/lib/containerd/ckpt"}
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		store   string
		wantTo  string
		wantErr bool
	}{
		{name: "ctr, no store: into the checkpoint path", wantTo: "file:///var/lib/containerd/ckpt/snapshot/cryo:checkpoint"},
		{name: "cri pod, no store: refused", ann: map[string]string{annotations.CRIContainerType: "sandbox", annotations.CRISandboxName: "web", annotations.CRISandboxNamespace: "default"}, wantErr: true},
		{name: "cri pod with a store", ann: map[string]string{annotations.CRIContainerType: "sandbox"}, store: "file:///s/x:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			made := &sandbox.Spec{Pod: &specs.Spec{Annotations: tc.ann}, CheckpointTo: tc.store}
			req, err := taskCheckpointRequest(r, made)
			if tc.wantErr {
				if err == nil || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), annotations.CheckpointTo) ||
					!strings.Contains(err.Error(), "default_checkpoint_to") || !strings.Contains(err.Error(), "default/web") {
					t.Fatalf("error = %v, want a failed precondition naming the pod, %s and default_checkpoint_to", err, annotations.CheckpointTo)
				}
				return
			}
			if err != nil || req.To != tc.wantTo {
				t.Fatalf("request %+v, %v; want To %q", req, err, tc.wantTo)
			}
		})
	}
}

// TestReadCheckpointRef: containerd's checkpoint directory holds what a
// checkpoint image carried; its reference is decoded strictly and never
// read through a symlink, and the store under it follows none.
func TestReadCheckpointRef(t *testing.T) {
	const d = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	write := func(t *testing.T, ref string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, checkpointRefFile), []byte(ref), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := write(t, `{"local":"checkpoint","digest":"`+d+`"}`)
	src, err := readCheckpointRef(dir)
	if err != nil || !src.Trusted || src.URL != "file://"+dir+"/snapshot/cryo:checkpoint" || src.Digest != d {
		t.Fatalf("local ref: %+v, %v", src, err)
	}
	if src, err := readCheckpointRef(write(t, `{"url":"s3://b/p:v1","digest":"`+d+`"}`)); err != nil || src.Trusted || src.URL != "s3://b/p:v1" {
		t.Fatalf("url ref: %+v, %v", src, err)
	}
	for _, bad := range []string{
		`{"local":"../../etc:x"}`, `{"local":"a/b"}`, `{"local":"checkpoint","digest":"sha256:../x"}`,
		`{"local":"checkpoint","digest":"md5:1"}`, `{}`, `{"url":"s3://b/p:v1\n"}`, `[`,
	} {
		if _, err := readCheckpointRef(write(t, bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want a refusal", bad, err)
		}
	}
	// The reference itself a symlink to a file elsewhere, or a FIFO.
	other := write(t, `{"local":"checkpoint"}`)
	link := t.TempDir()
	os.Symlink(filepath.Join(other, checkpointRefFile), filepath.Join(link, checkpointRefFile))
	if _, err := readCheckpointRef(link); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("symlinked reference: %v", err)
	}
	fifo := t.TempDir()
	syscall.Mkfifo(filepath.Join(fifo, checkpointRefFile), 0o600)
	if _, err := readCheckpointRef(fifo); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("FIFO reference: %v", err)
	}
	// snapshot/ a symlink to a store elsewhere: the store refuses it.
	target := t.TempDir()
	os.Symlink(target, filepath.Join(dir, "snapshot"))
	if _, err := stores.NewFileStore(filepath.Join(dir, "snapshot", "cryo")); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("store through a symlinked snapshot dir: %v", err)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("created %v through the symlink", ents)
	}
}
