package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cryo-runtime/cryo/agent"
	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

// agentClient implements guestAgent over the agent's ttrpc API. Short calls
// get a deadline; long polls (wait, stdio) run until the process ends or the
// connection closes.
type agentClient struct {
	api     *agent.Client
	timeout time.Duration
}

var _ agentConn = (*agentClient)(nil)

func newAgentClient(conn net.Conn, timeout time.Duration) *agentClient {
	if timeout <= 0 {
		timeout = defaultAgentTimeout
	}
	return &agentClient{api: agent.NewClient(conn), timeout: timeout}
}

func (a *agentClient) short(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

func (a *agentClient) ping(ctx context.Context) (guestInfo, error) {
	r, err := a.api.Ping(ctx, &agentapi.PingRequest{})
	if err != nil {
		return guestInfo{}, err
	}
	return guestInfo{BootID: r.BootId, Kernel: r.KernelRelease}, nil
}

func (a *agentClient) CreateContainer(ctx context.Context, r CreateRequest) error {
	spec, err := json.Marshal(r.Spec)
	if err != nil {
		return err
	}
	req := &agentapi.CreateContainerRequest{
		Id: r.ID, SpecJson: spec, Rootfs: &agentapi.Rootfs{Serial: r.Serial, Fstype: "ext4"},
		Stdin: r.Stdio.Stdin != "", Stdout: r.Stdio.Stdout != "", Stderr: r.Stdio.Stderr != "", Terminal: r.Stdio.Terminal,
		JoinContainer: r.JoinContainer, JoinNamespaces: r.Join, PidContainer: r.PidContainer,
	}
	for _, f := range r.Files {
		if f.Dir {
			req.Dirs = append(req.Dirs, &agentapi.Dir{Path: f.Path, Mode: unixMode(f.Mode), Uid: f.UID, Gid: f.GID})
			continue
		}
		req.Files = append(req.Files, &agentapi.File{Path: f.Path, Content: f.Content, Mode: unixMode(f.Mode), Uid: f.UID, Gid: f.GID})
	}
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err = a.api.CreateContainer(ctx, req)
	return err
}

func (a *agentClient) StartProcess(ctx context.Context, containerID, execID string) (uint32, error) {
	ctx, cancel := a.short(ctx)
	defer cancel()
	r, err := a.api.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: containerID, ExecId: execID})
	if err != nil {
		return 0, err
	}
	return r.Pid, nil
}

func (a *agentClient) ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, s Stdio) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err = a.api.ExecProcess(ctx, &agentapi.ExecProcessRequest{
		ContainerId: containerID, ExecId: execID, ProcessJson: b,
		Stdin: s.Stdin != "", Stdout: s.Stdout != "", Stderr: s.Stderr != "", Terminal: s.Terminal,
	})
	return err
}

func (a *agentClient) Signal(ctx context.Context, containerID, execID string, sig uint32, all bool) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: containerID, ExecId: execID, Signal: sig, All: all})
	return err
}

func (a *agentClient) Wait(ctx context.Context, containerID, execID string) (uint32, time.Time, error) {
	r, err := a.api.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: containerID, ExecId: execID})
	if err != nil {
		return 0, time.Time{}, err
	}
	at := time.Now()
	if r.ExitedAt != nil {
		at = r.ExitedAt.AsTime()
	}
	return r.ExitStatus, at, nil
}

func (a *agentClient) WaitOOM(ctx context.Context, containerID string, seen uint64) (uint64, error) {
	r, err := a.api.WaitOOM(ctx, &agentapi.WaitOOMRequest{ContainerId: containerID, Seen: seen})
	if err != nil {
		return 0, err
	}
	return r.OomKills, nil
}

func (a *agentClient) ReadStdio(ctx context.Context, containerID, execID string, stderr bool) ([]byte, error) {
	stream := agentapi.Stream_STREAM_STDOUT
	if stderr {
		stream = agentapi.Stream_STREAM_STDERR
	}
	r, err := a.api.ReadStdio(ctx, &agentapi.ReadStdioRequest{ContainerId: containerID, ExecId: execID, Stream: stream})
	if err != nil {
		return nil, err
	}
	if r.Eof {
		return r.Data, io.EOF
	}
	return r.Data, nil
}

func (a *agentClient) WriteStdin(ctx context.Context, containerID, execID string, data []byte) error {
	for len(data) > 0 {
		r, err := a.api.WriteStdin(ctx, &agentapi.WriteStdinRequest{ContainerId: containerID, ExecId: execID, Data: data})
		if err != nil {
			return err
		}
		if r.Written == 0 {
			return errors.New("guest accepted no stdin")
		}
		data = data[r.Written:]
	}
	return nil
}

func (a *agentClient) CloseStdin(ctx context.Context, containerID, execID string) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.CloseStdin(ctx, &agentapi.CloseStdinRequest{ContainerId: containerID, ExecId: execID})
	return err
}

func (a *agentClient) Resize(ctx context.Context, containerID, execID string, w, h uint32) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.ResizePty(ctx, &agentapi.ResizePtyRequest{ContainerId: containerID, ExecId: execID, Width: w, Height: h})
	return err
}

func (a *agentClient) Pids(ctx context.Context, containerID string) ([]uint32, error) {
	ctx, cancel := a.short(ctx)
	defer cancel()
	r, err := a.api.ListPids(ctx, &agentapi.ListPidsRequest{ContainerId: containerID})
	if err != nil {
		return nil, err
	}
	pids := make([]uint32, 0, len(r.Processes))
	for _, p := range r.Processes {
		pids = append(pids, p.Pid)
	}
	return pids, nil
}

// Stats returns the container's cgroup v2 metrics (io.containerd.cgroups.v2.Metrics)
// as the guest encoded them; containerd decodes them.
func (a *agentClient) Stats(ctx context.Context, containerID string) (*anypb.Any, error) {
	ctx, cancel := a.short(ctx)
	defer cancel()
	r, err := a.api.Stats(ctx, &agentapi.StatsRequest{ContainerId: containerID})
	if err != nil {
		return nil, err
	}
	return r.Metrics, nil
}

func (a *agentClient) RemoveContainer(ctx context.Context, containerID string) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: containerID})
	return err
}

func (a *agentClient) close() error { return a.api.Close() }

func (a *agentClient) sync(ctx context.Context) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.Sync(ctx, &agentapi.SyncRequest{})
	return err
}

// runHook runs argv inside the container's namespaces (the guest root when
// containerID is empty) and returns its combined output and exit status.
func (a *agentClient) runHook(ctx context.Context, containerID string, argv []string, timeout time.Duration) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+a.timeout)
	defer cancel()
	r, err := a.api.RunHook(ctx, &agentapi.RunHookRequest{Argv: argv, ContainerId: containerID, Timeout: durationpb.New(timeout)})
	if err != nil {
		return "", 0, err
	}
	return string(r.Output), int(r.ExitStatus), nil
}

// fixUpRestored tells a guest that was just restored what changed while it
// was frozen: the clock, and the randomness it must not share with its
// clones.
func (a *agentClient) fixUpRestored(ctx context.Context) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	if _, err := a.api.SetTime(ctx, &agentapi.SetTimeRequest{UnixNanos: time.Now().UnixNano()}); err != nil {
		return fmt.Errorf("set guest clock: %w", err)
	}
	seed := make([]byte, 64)
	if _, err := rand.Read(seed); err != nil {
		return err
	}
	if _, err := a.api.Reseed(ctx, &agentapi.ReseedRequest{Entropy: seed}); err != nil {
		return fmt.Errorf("reseed guest rng: %w", err)
	}
	return nil
}

func (a *agentClient) listContainers(ctx context.Context) ([]*agentapi.ContainerInfo, error) {
	ctx, cancel := a.short(ctx)
	defer cancel()
	r, err := a.api.ListContainers(ctx, &agentapi.ListContainersRequest{})
	if err != nil {
		return nil, err
	}
	return r.Containers, nil
}

func (a *agentClient) DeleteProcess(ctx context.Context, containerID, execID string) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	_, err := a.api.DeleteProcess(ctx, &agentapi.DeleteProcessRequest{ContainerId: containerID, ExecId: execID})
	return err
}

// unixMode is m's permission, setuid, setgid and sticky bits as the kernel
// spells them (os.FileMode keeps the last three elsewhere).
func unixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}
