package shim

import (
	"context"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	"github.com/cryo-runtime/cryo/internal/watchdog"
)

// longPolls are the calls that wait for as long as a process runs: the
// watchdog leaves them alone.
var longPolls = map[string]bool{"/containerd.task.v3.Task/Wait": true}

// UnaryServerInterceptor logs every task API call (and every call of
// cryo's own API beside it) with its duration and
// converts errors to gRPC codes, once, at the ttrpc boundary; when the
// environment arms the watchdog, a call that outruns it is reported with
// the shim's goroutine dump. The shim runner picks the interceptor up
// because the service implements shim.TTRPCServerUnaryOptioner.
func (s *service) UnaryServerInterceptor() ttrpc.UnaryServerInterceptor {
	bound := watchdog.FromEnv()
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
		start := time.Now()
		if !longPolls[info.FullMethod] {
			defer watchdog.Arm(ctx, info.FullMethod, bound)()
		}
		resp, err := method(ctx, unmarshal)
		entry := log.G(ctx).WithFields(log.Fields{"method": info.FullMethod, "duration": time.Since(start)})
		if err != nil {
			entry.WithError(err).Debug("task api call failed")
			return resp, errgrpc.ToGRPC(err)
		}
		entry.Debug("task api call")
		return resp, nil
	}
}
