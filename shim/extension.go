package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/durationpb"

	shimapi "github.com/cryo-runtime/cryo/shim/api/v1"
)

// sandboxAPI serves shimapi.SandboxService: cryo's extension beside the
// task API (as gVisor's shim adds restore beside it), not a fork of it.
type sandboxAPI struct{ s *service }

var _ shimapi.SandboxService = (*sandboxAPI)(nil)

func (x *sandboxAPI) Checkpoint(ctx context.Context, r *shimapi.CheckpointRequest) (*shimapi.CheckpointResponse, error) {
	if _, err := x.s.container(r.Id); err != nil {
		return nil, err
	}
	res, err := x.s.checkpoint(ctx, checkpointRequest{To: r.To, Exit: r.Exit, TTL: r.Ttl.AsDuration()})
	if err != nil {
		return nil, err
	}
	st := res.Stats
	return &shimapi.CheckpointResponse{
		Ref: res.Ref, Digest: res.Digest, PauseWindow: durationpb.New(res.PauseWindow), Duration: durationpb.New(res.Duration),
		RawBytes: st.RawBytes, StoredBytes: st.StoredBytes, UploadedBytes: st.UploadedBytes,
		Chunks: int64(st.Chunks), ChunksUploaded: int64(st.UploadedChunks), DeltaChunks: int64(st.Deltas),
	}, nil
}

func (x *sandboxAPI) Info(ctx context.Context, r *shimapi.InfoRequest) (*shimapi.InfoResponse, error) {
	sb := x.s.sandbox
	if sb == nil {
		return nil, fmt.Errorf("no sandbox: %w", errdefs.ErrNotFound)
	}
	resp := &shimapi.InfoResponse{SandboxId: sb.id, QemuPid: int32(sb.vm.Pid()), BootId: sb.info.BootID, RestoredFrom: sb.restoredFrom}
	x.s.mu.Lock()
	for id := range x.s.containers {
		resp.Containers = append(resp.Containers, id)
	}
	x.s.mu.Unlock()
	return resp, nil
}

// serveExtension serves the shim's own API on the sandbox's state dir.
func (s *service) serveExtension(sb *sandbox) error {
	path := filepath.Join(sb.stateDir, shimapi.ExtensionSocket)
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen %s: %w", path, err)
	}
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(func(ctx context.Context, u ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
		resp, err := m(ctx, u)
		if err != nil {
			log.G(s.ctx).WithError(err).WithField("method", info.FullMethod).Warn("cryo api call failed")
			return resp, errgrpc.ToGRPC(err)
		}
		return resp, nil
	}))
	if err != nil {
		l.Close()
		return err
	}
	shimapi.RegisterSandboxService(srv, &sandboxAPI{s: s})
	go func() { _ = srv.Serve(context.WithoutCancel(s.ctx), l) }()
	sb.ext = srv
	return nil
}

// writeContainerIndex rewrites the sandbox's shimapi.ContainersFile.
func (s *service) writeContainerIndex() {
	ns, _ := namespaces.Namespace(s.ctx)
	s.mu.Lock()
	sb := s.sandbox
	var lines []string
	for id := range s.containers {
		lines = append(lines, ns+"/"+id)
	}
	s.mu.Unlock()
	if sb == nil {
		return
	}
	if err := writeFileAtomic(filepath.Join(sb.stateDir, shimapi.ContainersFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		log.G(s.ctx).WithError(err).Warn("write container index")
	}
}

// taskCheckpointRequest reads containerd's checkpoint request: runc's
// CheckpointOptions (Exit) when present, and where the snapshot goes.
func taskCheckpointRequest(r *taskAPI.CheckpointTaskRequest, sb *sandbox) (checkpointRequest, error) {
	var req checkpointRequest
	if r.Options != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err == nil {
			if o, ok := v.(*runcoptions.CheckpointOptions); ok {
				req.Exit = o.Exit
			}
		}
	}
	if sb != nil && sb.req.CheckpointTo == "" {
		if err := refuseCRILocalCheckpoint(sb); err != nil {
			return req, err
		}
		if r.Path == "" {
			return req, fmt.Errorf("checkpoint: no store configured and no checkpoint path: %w", errdefs.ErrInvalidArgument)
		}
		// The file store follows no symlink in its path: name
		// containerd's directory by its real path.
		dir := r.Path
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		req.To = "file://" + filepath.Join(dir, "snapshot", "cryo") + ":" + localTag
		req.trusted = true
	}
	return req, nil
}

const localTag = "checkpoint"

func writeCheckpointRef(dir string, req checkpointRequest, res checkpointResult) error {
	if dir == "" {
		return nil
	}
	ref := checkpointRef{URL: res.Ref, Digest: res.Digest}
	if req.trusted {
		ref = checkpointRef{Local: localTag, Digest: res.Digest}
	}
	b, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, checkpointRefFile), b, 0o600)
}
