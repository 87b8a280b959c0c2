package shim

import (
	"context"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
)

// UnaryServerInterceptor logs every task API call with its duration and
// converts errors to gRPC codes, once, at the ttrpc boundary. The shim
// runner picks it up because the service implements
// shim.TTRPCServerUnaryOptioner.
func (s *service) UnaryServerInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
		start := time.Now()
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
