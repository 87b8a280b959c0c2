package shim

import (
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/annotations"
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
		{name: "cri pod, no store: refused", ann: map[string]string{criContainerType: "sandbox", criSandboxName: "web", criSandboxNamespace: "default"}, wantErr: true},
		{name: "cri pod with a store", ann: map[string]string{criContainerType: "sandbox"}, store: "file:///s/x:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := &sandbox{annotations: tc.ann, req: annotations.Request{CheckpointTo: tc.store}}
			req, err := taskCheckpointRequest(r, sb)
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
