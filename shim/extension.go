package shim

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cryo-runtime/cryo/internal/atomicfile"
	"github.com/cryo-runtime/cryo/sandbox"
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
	res, err := x.s.checkpoint(ctx, sandbox.CheckpointRequest{To: r.To, Exit: r.Exit, TTL: r.Ttl.AsDuration()})
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
	x.s.mu.Lock()
	sb := x.s.sb
	x.s.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("no sandbox: %w", errdefs.ErrNotFound)
	}
	in := sb.Info()
	resp := &shimapi.InfoResponse{SandboxId: in.ID, QemuPid: int32(in.QEMUPid), BootId: in.BootID, RestoredFrom: in.RestoredFrom}
	x.s.mu.Lock()
	for id := range x.s.containers {
		resp.Containers = append(resp.Containers, id)
	}
	x.s.mu.Unlock()
	return resp, nil
}

// serveExtension serves the shim's own API on the sandbox's state dir.
func (s *service) serveExtension(stateDir string) error {
	path := filepath.Join(stateDir, shimapi.ExtensionSocket)
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen %s: %w", path, err)
	}
	// The task API's interceptor: the same logs, watchdog and error codes.
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(s.UnaryServerInterceptor()))
	if err != nil {
		l.Close()
		return err
	}
	shimapi.RegisterSandboxService(srv, &sandboxAPI{s: s})
	go func() { _ = srv.Serve(context.WithoutCancel(s.ctx), l) }()
	s.mu.Lock()
	s.ext = srv
	s.mu.Unlock()
	return nil
}

// closeExtension stops serving the shim's own API.
func (s *service) closeExtension() {
	s.mu.Lock()
	srv := s.ext
	s.ext = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// writeContainerIndex rewrites the sandbox's shimapi.ContainersFile.
func (s *service) writeContainerIndex() {
	ns, _ := namespaces.Namespace(s.ctx)
	s.mu.Lock()
	sb, stateDir := s.sb, s.spec.StateDir
	var lines []string
	for id := range s.containers {
		lines = append(lines, ns+"/"+id)
	}
	s.mu.Unlock()
	if sb == nil {
		return
	}
	if err := atomicfile.Write(filepath.Join(stateDir, shimapi.ContainersFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		log.G(s.ctx).WithError(err).Warn("write container index")
	}
}
