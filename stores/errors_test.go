package stores

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
)

func TestIsTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&StatusError{Op: "GET x", StatusCode: 503}, true},
		{&StatusError{Op: "GET x", StatusCode: 500}, true},
		{&StatusError{Op: "GET x", StatusCode: 429}, true},
		{&StatusError{Op: "GET x", StatusCode: 404}, false},
		{&StatusError{Op: "GET x", StatusCode: 403}, false},
		{&StatusError{Op: "GET x", StatusCode: 416}, false},
		{fmt.Errorf("wrapped: %w", minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}), true},
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}, false},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("x: %w", errStalled), true},
		{context.Canceled, false},
		{fmt.Errorf("blob: %w", errdefs.ErrNotFound), false},
		{errors.New("something else"), false},
		{nil, false},
	} {
		if got := isTransient(tc.err); got != tc.want {
			t.Errorf("isTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if !errdefs.IsNotFound(&StatusError{StatusCode: 404}) || !errdefs.IsUnavailable(&StatusError{StatusCode: 502}) {
		t.Error("StatusError does not unwrap to its errdefs sentinel")
	}
}
