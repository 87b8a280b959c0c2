package shim

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/sandbox"
)

var (
	_     taskAPI.TTRPCTaskService = (*service)(nil)
	_     shim.TTRPCService        = (*service)(nil)
	empty                          = &ptypes.Empty{}
)

// service is the containerd task API of one shim process: one sandbox VM and
// the containers in it. Handlers look the process up, delegate, and return;
// errors become gRPC codes once, in the interceptor.
type service struct {
	ctx      context.Context
	shutdown shutdown.Service
	events   chan any
	// flush tells forward to publish what is queued and stop: the shim
	// exits as soon as its shutdown callbacks return, and an event still
	// queued then (the TaskDelete of the last task) would be lost.
	flush    chan struct{}
	createMu sync.Mutex // serializes Create: the first one boots the VM
	vms      sandboxMaker
	mu       sync.Mutex
	sb       vmSandbox
	// spec is what sb was made from: the shim's own copy of its
	// directories, annotations and request.
	spec sandbox.Spec
	// vmPaused is set while the task API holds the VM paused: the shim
	// paused it, and neither resumed it nor saw it stop since.
	vmPaused atomic.Bool
	// restored holds the guest containers of a restored sandbox that no
	// task has taken over yet.
	restored   *restoredPod
	containers map[string]*container
	// created numbers the containers in the order they were added.
	created uint64
	// ran are the CRI names of every container the sandbox ran: those no
	// longer among containers are the finished ones a checkpoint records.
	ran map[string]bool
	// bundle and diskDir are those of the container that made the
	// sandbox: the state pointer lives in one, the disks in the other.
	bundle, diskDir string
	// ext serves the shim's own API (cryoctl) on the state dir.
	ext *ttrpc.Server
}

// NewTaskService returns the task service and starts forwarding its events
// to containerd.
func NewTaskService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service) (taskAPI.TTRPCTaskService, error) {
	s := &service{
		ctx:        ctx,
		shutdown:   sd,
		events:     make(chan any, 128),
		flush:      make(chan struct{}),
		containers: map[string]*container{},
		vms:        vms{},
	}
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		s.forward(ctx, publisher)
	}()
	go trimMemory(ctx)
	sd.RegisterCallback(func(ctx context.Context) error {
		s.mu.Lock()
		sb := s.sb
		s.mu.Unlock()
		var err error
		s.closeExtension()
		if sb != nil {
			err = sb.Shutdown(ctx)
		}
		// The sandbox is gone: no more events. Publish the queued ones
		// before the process exits.
		close(s.flush)
		select {
		case <-forwarded:
		case <-ctx.Done():
			log.G(ctx).Warn("shutdown: events not all published")
		}
		return err
	})
	return s, nil
}

// RegisterTTRPC registers the task service.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if _, err := s.container(r.ID); err == nil {
		return nil, fmt.Errorf("container %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	c, err := s.createContainer(ctx, r)
	if err != nil {
		return nil, err
	}
	pid := s.taskPid(c.init)
	s.recordTaskPid(ctx, c, pid)
	s.send(&eventstypes.TaskCreate{
		ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs, Checkpoint: r.Checkpoint,
		IO:  &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid: pid,
	})
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := s.startProcess(ctx, c, p); err != nil {
		return nil, err
	}
	pid := s.taskPid(p)
	if r.ExecID == "" {
		s.send(&eventstypes.TaskStart{ContainerID: r.ID, Pid: pid})
		go s.watchOOM(c)
	} else {
		s.send(&eventstypes.TaskExecStarted{ContainerID: r.ID, ExecID: r.ExecID, Pid: pid})
	}
	go s.waitExit(c, p)
	return &taskAPI.StartResponse{Pid: pid}, nil
}

func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := p.transition(stateDeleted); err != nil {
		return nil, err
	}
	p.io.close()
	status, at := p.exit()
	pid := s.taskPid(p)
	if r.ExecID != "" {
		c.removeExec(r.ExecID)
		if err := s.sb.Guest().DeleteProcess(ctx, c.guestID, r.ExecID); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("exec", r.ExecID).Warn("forget exec in guest")
		}
	} else {
		s.deleteContainer(ctx, c)
		s.send(&eventstypes.TaskDelete{ContainerID: r.ID, Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)})
	}
	return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	c, err := s.container(r.ID)
	if err != nil {
		return nil, err
	}
	if err := s.execProcess(ctx, c, r); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return empty, nil
}

func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	c, _, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	return empty, s.sb.Guest().Resize(ctx, c.guestID, r.ExecID, r.Width, r.Height)
}

func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	status, at := p.exit()
	return &taskAPI.StateResponse{
		ID: r.ID, ExecID: r.ExecID, Bundle: c.bundle, Pid: s.taskPid(p), Status: p.status(),
		Stdin: p.stdio.Stdin, Stdout: p.stdio.Stdout, Stderr: p.stdio.Stderr, Terminal: p.stdio.Terminal,
		ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at),
	}, nil
}

func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	_, p, err := s.process(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := p.transition(statePaused); err != nil {
		return nil, err
	}
	if err := s.sb.Pause(ctx); err != nil {
		_ = p.transition(stateRunning)
		return nil, err
	}
	s.vmPaused.Store(true)
	s.send(&eventstypes.TaskPaused{ContainerID: r.ID})
	return empty, nil
}

func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	_, p, err := s.process(r.ID, "")
	if err != nil {
		return nil, err
	}
	if p.current() != statePaused {
		return nil, fmt.Errorf("container %s is %s, not paused: %w", r.ID, p.current(), errdefs.ErrFailedPrecondition)
	}
	if err := s.sb.Resume(ctx); err != nil {
		return nil, err
	}
	s.vmPaused.Store(false)
	_ = p.transition(stateRunning)
	s.send(&eventstypes.TaskResumed{ContainerID: r.ID})
	return empty, nil
}

func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	return empty, s.kill(ctx, c, p, r.Signal, r.All)
}

func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	c, err := s.container(r.ID)
	if err != nil {
		return nil, err
	}
	guestPids, err := s.sb.Guest().Pids(ctx, c.guestID)
	if err != nil {
		return nil, err
	}
	// One host process runs the container's processes: the VM (see
	// taskPid). No process, no pid: containerd takes an empty list for a
	// task that has nothing left running.
	resp := &taskAPI.PidsResponse{}
	if len(guestPids) > 0 {
		resp.Processes = []*task.ProcessInfo{{Pid: s.vmPid()}}
	}
	return resp, nil
}

func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin && p.io != nil {
		p.io.closeStdin()
	}
	return empty, nil
}

// Checkpoint is containerd's checkpoint (ctr task checkpoint, CRI
// CheckpointContainer): the sandbox goes to the store its annotations or the
// node config name, and Path receives a reference to it; with no store, the
// snapshot itself goes into Path, so containerd's checkpoint image holds it.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	if _, err := s.container(r.ID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	var made *sandbox.Spec
	if s.sb != nil {
		spec := s.spec
		made = &spec
	}
	s.mu.Unlock()
	req, err := taskCheckpointRequest(r, made)
	if err != nil {
		return nil, err
	}
	res, err := s.checkpoint(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := writeCheckpointRef(r.Path, req, res); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskCheckpointed{ContainerID: r.ID, Checkpoint: r.Path})
	return empty, nil
}

func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	if _, err := s.container(r.ID); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("update resources of a vm sandbox: %w", errdefs.ErrNotImplemented)
}

func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	status, at := p.exit()
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	c, err := s.container(r.ID)
	if err != nil {
		return nil, err
	}
	st, err := s.sb.Guest().Stats(ctx, c.guestID)
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: st}, nil
}

func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	resp := &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid())}
	if c, err := s.container(r.ID); err == nil {
		resp.TaskPid = s.taskPid(c.init)
	}
	return resp, nil
}

func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	s.mu.Lock()
	n := len(s.containers)
	s.mu.Unlock()
	if n == 0 {
		s.shutdown.Shutdown()
	}
	return empty, nil
}

func (s *service) container(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (s *service) process(id, execID string) (*container, *process, error) {
	c, err := s.container(id)
	if err != nil {
		return nil, nil, err
	}
	p, err := c.process(execID)
	return c, p, err
}

func (s *service) send(e any) {
	select {
	case s.events <- e:
	case <-s.shutdown.Done():
	}
}

// forward publishes the events in order until flush, then what is queued.
func (s *service) forward(ctx context.Context, publisher shim.Publisher) {
	ns, _ := namespaces.Namespace(ctx)
	ctx = namespaces.WithNamespace(context.WithoutCancel(ctx), ns)
	defer publisher.Close()
	// A containerd that does not answer cannot hold the shim for long:
	// pkg/shim exits 5 s after shutdown whatever the callbacks do.
	publish := func(e any) {
		if err := publisher.Publish(ctx, runtime.GetTopic(e), e); err != nil {
			log.G(ctx).WithError(err).Error("post event")
		}
	}
	for {
		select {
		case e := <-s.events:
			publish(e)
		case <-s.flush:
			for {
				select {
				case e := <-s.events:
					publish(e)
				default:
					return
				}
			}
		}
	}
}

// checkpoint checkpoints the sandbox with its containers, the sandbox's
// own first.
func (s *service) checkpoint(ctx context.Context, req sandbox.CheckpointRequest) (sandbox.CheckpointResult, error) {
	s.mu.Lock()
	sb := s.sb
	for id, c := range s.containers {
		a := c.spec.Annotations
		ct := sandbox.Container{GuestID: c.guestID, Spec: c.spec, Disk: c.disk.ID, Name: a[annotations.CRIContainerName], Image: a[annotations.CRIImageName]}
		if sb != nil && id == sb.Info().ID {
			req.Containers = append([]sandbox.Container{ct}, req.Containers...)
		} else {
			req.Containers = append(req.Containers, ct)
		}
	}
	req.Finished = s.finishedLocked()
	if s.spec.Pod != nil {
		req.Pod = podRef(s.spec.Pod.Annotations)
	}
	s.mu.Unlock()
	if sb == nil {
		return sandbox.CheckpointResult{}, fmt.Errorf("checkpoint: no sandbox: %w", errdefs.ErrFailedPrecondition)
	}
	res, err := sb.Checkpoint(ctx, req)
	if err == nil && req.Exit {
		s.vmPaused.Store(false) // the VM is gone
	}
	return res, err
}

// finishedLocked are the CRI names of the containers the sandbox ran that
// no task holds now.
func (s *service) finishedLocked() []string {
	live := map[string]bool{}
	for _, c := range s.containers {
		live[c.spec.Annotations[annotations.CRIContainerName]] = true
	}
	var names []string
	for name := range s.ran {
		if !live[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// podRef names the pod whose CRI annotations a are, for a snapshot's
// source info.
func podRef(a map[string]string) sandbox.PodRef {
	return sandbox.PodRef{Name: a[annotations.CRISandboxName], Namespace: a[annotations.CRISandboxNamespace], UID: a[annotations.CRISandboxUID]}
}
