package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

// Config configures the guest service; zero fields take the defaults used in
// the guest.
type Config struct {
	StateDir    string        // per-container state and root mounts: /run/cryo/c
	CgroupRoot  string        // cgroup2 mount: /sys/fs/cgroup
	SysBlock    string        // /sys/block, to find disks by serial
	DevDir      string        // their device nodes: /dev
	DiskTimeout time.Duration // how long to wait for a hot-plugged disk: 10s
	// PowerOff is called by Shutdown after the reply went out.
	PowerOff func()
}

// Service implements the agent API inside the guest.
type Service struct {
	reaper      *Reaper
	stateDir    string
	cgroupRoot  string
	sysBlock    string
	devDir      string
	diskTimeout time.Duration
	powerOff    func()

	mu         sync.Mutex
	containers map[string]*container // nil value: being created
	envd       *http.Server          // once a container asked for it
	envdTarget *envdContainer        // the container envd serves
	podShm     string                // the pod's /dev/shm tmpfs, once made
}

var _ agentapi.AgentService = (*Service)(nil)

// NewService returns the guest side of the agent API; r must be running.
func NewService(r *Reaper, cfg Config) *Service {
	s := &Service{
		reaper: r, stateDir: cfg.StateDir, cgroupRoot: cfg.CgroupRoot, sysBlock: cfg.SysBlock, devDir: cfg.DevDir,
		diskTimeout: cfg.DiskTimeout, powerOff: cfg.PowerOff, containers: map[string]*container{},
	}
	if s.stateDir == "" {
		s.stateDir = "/run/cryo/c"
	}
	if s.cgroupRoot == "" {
		s.cgroupRoot = "/sys/fs/cgroup"
	}
	if s.devDir == "" {
		s.devDir = "/dev"
	}
	if s.sysBlock == "" {
		s.sysBlock = "/sys/block"
	}
	if s.diskTimeout == 0 {
		s.diskTimeout = 10 * time.Second
	}
	return s
}

func (s *Service) container(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[id]
	if c == nil {
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (s *Service) process(cid, execID string) (*process, error) {
	c, err := s.container(cid)
	if err != nil {
		return nil, err
	}
	return c.process(execID)
}

func (s *Service) CreateContainer(ctx context.Context, req *agentapi.CreateContainerRequest) (*agentapi.CreateContainerResponse, error) {
	if err := validID(req.Id); err != nil {
		return nil, err
	}
	spec, err := decodeSpec(req.SpecJson)
	if err != nil {
		return nil, err
	}
	envdHash, wantEnvd, err := envdRequest(spec)
	if err != nil {
		return nil, err
	}
	cc := &ContainerConfig{ID: req.Id, Spec: spec, Stdio: StdioConfig{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Terminal: req.Terminal},
		JoinContainer: req.JoinContainer, Join: req.JoinNamespaces, PidContainer: req.PidContainer}
	if r := req.Rootfs; r != nil {
		cc.DiskSerial, cc.FSType, cc.Options = r.Serial, r.Fstype, r.Options
	}
	for _, f := range req.Files {
		if !path.IsAbs(f.Path) {
			return nil, fmt.Errorf("file path %q is not absolute: %w", f.Path, errdefs.ErrInvalidArgument)
		}
		cc.Files = append(cc.Files, fileEntry{Path: f.Path, Content: f.Content, Mode: f.Mode, UID: f.Uid, GID: f.Gid})
	}
	for _, d := range req.Dirs {
		if !path.IsAbs(d.Path) {
			return nil, fmt.Errorf("directory path %q is not absolute: %w", d.Path, errdefs.ErrInvalidArgument)
		}
		cc.Files = append(cc.Files, fileEntry{Path: d.Path, Mode: d.Mode, UID: d.Uid, GID: d.Gid, Dir: true})
	}
	s.mu.Lock()
	if _, ok := s.containers[req.Id]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("container %q: %w", req.Id, errdefs.ErrAlreadyExists)
	}
	s.containers[req.Id] = nil // reserve the id
	s.mu.Unlock()
	c, err := s.createContainer(ctx, cc)
	if err == nil && wantEnvd {
		if err = s.startEnvd(ctx, c, envdHash); err != nil {
			c.cleanup(context.WithoutCancel(ctx))
		}
	}
	s.mu.Lock()
	if err != nil {
		delete(s.containers, req.Id)
	} else {
		s.containers[req.Id] = c
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &agentapi.CreateContainerResponse{Pid: uint32(c.init.Pid())}, nil
}

func (s *Service) StartProcess(ctx context.Context, req *agentapi.StartProcessRequest) (*agentapi.StartProcessResponse, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	var pid int
	if req.ExecId == "" {
		pid, err = c.start(ctx)
	} else {
		var p *process
		if p, err = c.process(req.ExecId); err == nil {
			pid, err = c.startExec(ctx, s.reaper, p)
		}
	}
	if err != nil {
		return nil, err
	}
	return &agentapi.StartProcessResponse{Pid: uint32(pid)}, nil
}

func (s *Service) ExecProcess(ctx context.Context, req *agentapi.ExecProcessRequest) (*emptypb.Empty, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	var sp specs.Process
	if err := json.Unmarshal(req.ProcessJson, &sp); err != nil {
		return nil, fmt.Errorf("decode process: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	pc, err := translateProcess(&sp)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	stdio := StdioConfig{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Terminal: req.Terminal}
	return &emptypb.Empty{}, c.addExec(req.ExecId, &helperConfig{Mode: helperExec, Process: *pc}, stdio)
}

func (s *Service) SignalProcess(ctx context.Context, req *agentapi.SignalProcessRequest) (*emptypb.Empty, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	// All is for the container (ctr task kill --all); runc's shim ignores
	// it for an exec, which a kill of signals alone.
	if req.All && req.ExecId == "" {
		return &emptypb.Empty{}, c.signalAll(unix.Signal(req.Signal))
	}
	p, err := c.process(req.ExecId)
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, p.Signal(unix.Signal(req.Signal))
}

func (s *Service) WaitProcess(ctx context.Context, req *agentapi.WaitProcessRequest) (*agentapi.WaitProcessResponse, error) {
	p, err := s.process(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	e, err := p.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return &agentapi.WaitProcessResponse{ExitStatus: uint32(e.Status), ExitedAt: timestamppb.New(e.At)}, nil
}

func (s *Service) WaitOOM(ctx context.Context, req *agentapi.WaitOOMRequest) (*agentapi.WaitOOMResponse, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	n, err := c.oom.wait(ctx, req.Seen)
	if errors.Is(err, errOOMGone) {
		return nil, fmt.Errorf("container %q: %w: %w", req.ContainerId, err, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &agentapi.WaitOOMResponse{OomKills: n}, nil
}

func (s *Service) DeleteProcess(ctx context.Context, req *agentapi.DeleteProcessRequest) (*emptypb.Empty, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, c.deleteExec(req.ExecId)
}

func (s *Service) ReadStdio(ctx context.Context, req *agentapi.ReadStdioRequest) (*agentapi.ReadStdioResponse, error) {
	p, err := s.process(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	b := p.stdout
	switch req.Stream {
	case agentapi.Stream_STREAM_STDOUT:
	case agentapi.Stream_STREAM_STDERR:
		b = p.stderr
	default:
		return nil, fmt.Errorf("stream %v: %w", req.Stream, errdefs.ErrInvalidArgument)
	}
	max := int(req.Max)
	if max <= 0 {
		max = 64 << 10
	}
	data, eof, err := b.Read(ctx, min(max, 1<<20))
	if err != nil {
		return nil, err
	}
	return &agentapi.ReadStdioResponse{Data: data, Eof: eof}, nil
}

func (s *Service) WriteStdin(ctx context.Context, req *agentapi.WriteStdinRequest) (*agentapi.WriteStdinResponse, error) {
	p, err := s.process(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	n, err := p.WriteStdin(req.Data)
	if err != nil {
		return nil, err
	}
	return &agentapi.WriteStdinResponse{Written: uint32(n)}, nil
}

func (s *Service) CloseStdin(ctx context.Context, req *agentapi.CloseStdinRequest) (*emptypb.Empty, error) {
	p, err := s.process(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, p.CloseStdin()
}

func (s *Service) ResizePty(ctx context.Context, req *agentapi.ResizePtyRequest) (*emptypb.Empty, error) {
	p, err := s.process(req.ContainerId, req.ExecId)
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, p.Resize(req.Width, req.Height)
}

func (s *Service) ListPids(ctx context.Context, req *agentapi.ListPidsRequest) (*agentapi.ListPidsResponse, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	pids, names, err := c.pids()
	if err != nil {
		return nil, err
	}
	resp := &agentapi.ListPidsResponse{}
	for _, pid := range pids {
		resp.Processes = append(resp.Processes, &agentapi.ProcessInfo{Pid: uint32(pid), ExecId: names[pid]})
	}
	return resp, nil
}

func (s *Service) ListContainers(ctx context.Context, req *agentapi.ListContainersRequest) (*agentapi.ListContainersResponse, error) {
	s.mu.Lock()
	cs := make([]*container, 0, len(s.containers))
	for _, c := range s.containers {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	resp := &agentapi.ListContainersResponse{}
	for _, c := range cs {
		c.init.mu.Lock()
		info := &agentapi.ContainerInfo{Id: c.id, InitPid: uint32(c.init.pid), InitState: c.init.state.String()}
		c.init.mu.Unlock()
		resp.Containers = append(resp.Containers, info)
	}
	sort.Slice(resp.Containers, func(i, j int) bool { return resp.Containers[i].Id < resp.Containers[j].Id })
	return resp, nil
}

func (s *Service) Stats(ctx context.Context, req *agentapi.StatsRequest) (*agentapi.StatsResponse, error) {
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, err
	}
	m, err := c.cg.Stat()
	if err != nil {
		return nil, fmt.Errorf("stats of %s: %w", c.id, err)
	}
	// typeurl's URL (no type.googleapis.com/ prefix) is what containerd
	// clients such as `ctr task metrics` match on.
	a, err := typeurl.MarshalAny(m)
	if err != nil {
		return nil, err
	}
	return &agentapi.StatsResponse{Metrics: typeurl.MarshalProto(a)}, nil
}

func (s *Service) RemoveContainer(ctx context.Context, req *agentapi.RemoveContainerRequest) (*emptypb.Empty, error) {
	c, err := s.container(req.Id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.containers, req.Id)
	s.mu.Unlock()
	c.oom.end()
	return &emptypb.Empty{}, c.cleanup(ctx)
}
