package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/cryo-runtime/cryo/agent/guest.Version=...".
var Version = "dev"

const (
	defaultHookTimeout = 30 * time.Second
	maxHookOutput      = 1 << 20
)

func (s *Service) Ping(ctx context.Context, _ *agentapi.PingRequest) (*agentapi.PingResponse, error) {
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nil, err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, err
	}
	up, err := readUptime("/proc/uptime")
	if err != nil {
		return nil, err
	}
	return &agentapi.PingResponse{
		BootId:        strings.TrimSpace(string(bootID)),
		KernelRelease: unix.ByteSliceToString(uts.Release[:]),
		Uptime:        durationpb.New(up),
		AgentVersion:  Version,
	}, nil
}

func readUptime(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("empty %s", path)
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func (s *Service) SetTime(ctx context.Context, req *agentapi.SetTimeRequest) (*emptypb.Empty, error) {
	ts := unix.NsecToTimespec(req.UnixNanos)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return nil, fmt.Errorf("set clock: %w", err)
	}
	return &emptypb.Empty{}, nil
}

func (s *Service) Sync(ctx context.Context, _ *agentapi.SyncRequest) (*emptypb.Empty, error) {
	unix.Sync()
	return &emptypb.Empty{}, nil
}

func (s *Service) Shutdown(ctx context.Context, _ *agentapi.ShutdownRequest) (*emptypb.Empty, error) {
	if s.powerOff == nil {
		return nil, fmt.Errorf("shutdown: %w", errdefs.ErrNotImplemented)
	}
	unix.Sync()
	go func() {
		time.Sleep(100 * time.Millisecond) // let the reply reach the host
		s.powerOff()
	}()
	return &emptypb.Empty{}, nil
}

// RunHook runs argv in the guest root, or in a container like an exec process
// of the container's init, and returns the combined output.
func (s *Service) RunHook(ctx context.Context, req *agentapi.RunHookRequest) (*agentapi.RunHookResponse, error) {
	if len(req.Argv) == 0 {
		return nil, fmt.Errorf("hook has no argv: %w", errdefs.ErrInvalidArgument)
	}
	timeout := defaultHookTimeout
	if req.Timeout != nil && req.Timeout.AsDuration() > 0 {
		timeout = req.Timeout.AsDuration()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p, cleanup, err := s.startHook(ctx, req)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	var out bytes.Buffer
	for {
		b, eof, err := p.stdout.Read(ctx, 64<<10)
		if err != nil {
			break // timeout: kill below
		}
		if room := maxHookOutput - out.Len(); room > 0 {
			out.Write(b[:min(room, len(b))])
		}
		if eof {
			break
		}
	}
	if ctx.Err() != nil {
		p.Signal(unix.SIGKILL)
	}
	e, err := p.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"argv": req.Argv, "container": req.ContainerId, "exit": e.Status}).Info("hook ran")
	return &agentapi.RunHookResponse{Output: out.Bytes(), ExitStatus: int32(e.Status)}, nil
}

// startHook starts the hook process with stdout and stderr on one pipe.
func (s *Service) startHook(ctx context.Context, req *agentapi.RunHookRequest) (*process, func(), error) {
	env := req.Env
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	stdio := StdioConfig{Stdout: true, Stderr: true, combined: true}
	if req.ContainerId == "" {
		p := newProcess("hook", nil, stdio)
		cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
		cmd.Env, cmd.Dir = env, "/"
		w, err := pipeTo(p.stdout, new([]*os.File))
		if err != nil {
			return nil, nil, err
		}
		p.stderr.CloseWrite()
		cmd.Stdout, cmd.Stderr = w, w
		err = s.reaper.Start(cmd, p.setExited)
		w.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("run hook %s: %w", req.Argv[0], err)
		}
		p.pid = cmd.Process.Pid
		cmd.Process.Release()
		return p, func() {}, nil
	}
	c, err := s.container(req.ContainerId)
	if err != nil {
		return nil, nil, err
	}
	id := fmt.Sprintf("hook-%d", time.Now().UnixNano())
	cfg := &helperConfig{Mode: helperExec, Process: processConfig{Args: req.Argv, Env: env, Cwd: "/"}}
	if err := c.addExec(id, cfg, stdio); err != nil {
		return nil, nil, err
	}
	cleanup := func() { c.deleteExec(id) }
	p, _ := c.process(id)
	if _, err := c.startExec(ctx, s.reaper, p); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("run hook in %s: %w", c.id, err)
	}
	return p, cleanup, nil
}

// Reseed adds the host's random bytes to the input pool, credited, and forces
// a reseed of the kernel's CRNG.
func (s *Service) Reseed(ctx context.Context, req *agentapi.ReseedRequest) (*emptypb.Empty, error) {
	if len(req.Entropy) < 32 || len(req.Entropy) > 4096 {
		return nil, fmt.Errorf("reseed with %d bytes, want 32 to 4096: %w", len(req.Entropy), errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(req.Entropy))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(req.Entropy)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(req.Entropy)))
	copy(info[8:], req.Entropy)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return nil, fmt.Errorf("add entropy: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return nil, fmt.Errorf("reseed crng: %w", e)
	}
	return &emptypb.Empty{}, nil
}
