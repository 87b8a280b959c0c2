// Package shim is cryo's containerd shim v2, containerd's side of it: the
// manager (start and delete actions of the binary), the task service, its
// containers, processes and I/O, and containerd's checkpoint-directory
// contract. The VM itself is package sandbox's.
package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/sandbox"
)

// RuntimeName is the containerd runtime type served by this shim.
const RuntimeName = configs.RuntimeType

// Version is set at build time.
var Version = "dev"

// groupLabels decide which containers share one shim process, and so one VM:
// the containers of one CRI pod.
var groupLabels = []string{
	"io.containerd.cryo.v2.group",
	"io.kubernetes.cri.sandbox-id",
}

// NewManager returns the shim manager: the part of the binary that runs for
// containerd's start and delete actions.
func NewManager(name string) shim.Shim { return &manager{name: name} }

type manager struct{ name string }

var _ shim.Shim = (*manager)(nil)

func (m *manager) Name() string { return m.name }

// Start starts (or finds) the long-running shim process that serves the
// container's group, like the runc shim: the first container of a pod starts
// it, later ones are routed to its socket.
func (m *manager) Start(ctx context.Context, params *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	id := params.GetInstanceID()
	grouping := id
	annotations, err := readBundleAnnotations(".")
	if err != nil {
		return nil, err
	}
	for _, l := range groupLabels {
		if g, ok := annotations[l]; ok && g != "" {
			grouping = g
			break
		}
	}
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc"}

	socketDir := params.GetSocketDir()
	if socketDir == "" {
		socketDir = "/run/containerd/s"
	}
	addr, err := shim.CreateSocketAddress(ctx, socketDir, params.GetContainerdGrpcAddress(), grouping, false)
	if err != nil {
		return nil, err
	}
	l, err := shim.NewSocket(addr)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
		if shim.CanConnect(addr) {
			// The pod's shim is running: this container joins its VM.
			result.Address = addr
			return result, nil
		}
		if err := shim.RemoveSocket(addr); err != nil {
			return nil, fmt.Errorf("remove stale shim socket: %w", err)
		}
		if l, err = shim.NewSocket(addr); err != nil {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			l.Close()
			_ = shim.RemoveSocket(addr)
		}
	}()
	f, err := l.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()

	cmd, err := serveCommand(ctx, id, params)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shim process: %w", err)
	}
	go cmd.Wait() //nolint:errcheck // reaped; the shim process outlives this action
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("adjust shim oom score: %w", err)
	}
	result.Address = addr
	return result, nil
}

func serveCommand(ctx context.Context, id string, params *bootapi.BootstrapParams) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", params.GetContainerdGrpcAddress()}
	if params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=4")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// Stop is the binary's delete action: containerd calls it when the shim is
// gone (killed, crashed) to clean up the container from its bundle alone.
// When the bundle holds a VM, that VM is killed and its state removed.
func (m *manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	st := stopStatus(ctx, bundle)
	stateDir, err := readStatePointer(bundle)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return st, nil
	case err != nil:
		return st, err
	}
	if diskDir, err := readDiskPointer(stateDir); err == nil {
		if err := os.RemoveAll(diskDir); err != nil {
			log.G(ctx).WithError(err).WithField("disks", diskDir).Warn("remove sandbox disks")
		}
	}
	if err := sandbox.Cleanup(stateDir); err != nil {
		log.G(ctx).WithError(err).WithField("state", stateDir).Warn("clean up sandbox")
		// Only a state dir left behind fails the delete, as before.
		if _, serr := os.Stat(stateDir); serr == nil {
			return st, err
		}
	}
	_ = os.Remove(filepath.Join(bundle, statePointerFile))
	return st, nil
}

// stopStatus is what the task's exit was: its exit record when it exited
// before the shim died, killed now otherwise, with the pid the task had
// either way (containerd publishes it in TaskExit and TaskDelete).
func stopStatus(ctx context.Context, bundle string) shim.StopStatus {
	if e, err := readExitRecord(bundle); err == nil {
		return shim.StopStatus{Pid: e.Pid, ExitStatus: e.Status, ExitedAt: e.ExitedAt}
	}
	st := shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}
	pid, err := readPidRecord(bundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).Warn("read task pid from bundle")
	}
	st.Pid = int(pid)
	return st
}

// Info describes the runtime to containerd.
func (m *manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	return &types.RuntimeInfo{
		Name:    m.name,
		Version: &types.RuntimeVersion{Version: Version},
	}, nil
}

func readBundleAnnotations(bundle string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle spec: %w", err)
	}
	var s struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse bundle spec: %w", err)
	}
	return s.Annotations, nil
}
