package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/agent/session"
)

// PortName is the virtio-serial port the host talks to the agent on.
const PortName = "agent.0"

// Serve serves the agent API on port until ctx ends, one ttrpc connection per
// host session (see package session).
func Serve(ctx context.Context, svc agentapi.AgentService, port session.Port) error {
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(interceptor))
	if err != nil {
		return err
	}
	agentapi.RegisterAgentService(srv, svc)
	l := session.NewListener(ctx, port, 10*time.Millisecond)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	return srv.Serve(ctx, l)
}

// interceptor logs every call and converts errdefs errors into gRPC status
// codes, once, at the ttrpc boundary.
func interceptor(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	t := time.Now()
	resp, err := method(ctx, unmarshal)
	entry := log.G(ctx).WithFields(log.Fields{"method": info.FullMethod, "took": time.Since(t)})
	if err != nil {
		if errors.Is(err, context.Canceled) {
			// a long poll whose host session ended: routine
			entry.WithError(err).Debug("agent call canceled")
		} else {
			entry.WithError(err).Warn("agent call failed")
		}
		return nil, errgrpc.ToGRPC(err)
	}
	entry.Debug("agent call")
	return resp, nil
}

// Run is the guest's PID 1: boot, then serve the agent port forever. It only
// returns on a fatal error; the caller powers the VM off.
func Run(ctx context.Context) error {
	if err := Boot(ctx, "/modules.load"); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if cmdline, _ := os.ReadFile("/proc/cmdline"); strings.Contains(string(cmdline), "cryo.debug=1") {
		log.SetLevel("debug")
	}
	reaper := NewReaper()
	go reaper.Run(nil)
	svc := NewService(reaper, Config{PowerOff: PowerOff})
	dev, err := FindPort(ctx, "/sys/class/virtio-ports", PortName, 30*time.Second)
	if err != nil {
		return err
	}
	port, err := OpenPort(dev)
	if err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"port": dev, "version": Version}).Info("cryo-agent serving")
	return Serve(ctx, svc, port)
}

// PowerOff syncs and powers the VM off.
func PowerOff() {
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
