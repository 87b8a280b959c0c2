package stores

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/cryo-runtime/cryo/internal/redact"
)

// errStalled is the cause set on a request context that made no progress for
// Options.StallTimeout.
var errStalled = errors.New("store stalled")

// StatusError is an HTTP-level failure of a store request. It unwraps to the
// errdefs sentinel matching its status code, so callers use errdefs.IsNotFound
// and friends instead of matching codes.
type StatusError struct {
	Op         string // "GET https://host/path"
	StatusCode int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %d %s", e.Op, e.StatusCode, http.StatusText(e.StatusCode))
}

// Unwrap maps the status code to an errdefs sentinel.
func (e *StatusError) Unwrap() error { return statusSentinel(e.StatusCode) }

func statusSentinel(code int) error {
	switch {
	case code == http.StatusNotFound:
		return errdefs.ErrNotFound
	case code == http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case code == http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented:
		return errdefs.ErrNotImplemented
	case code == http.StatusRequestedRangeNotSatisfiable:
		return errdefs.ErrOutOfRange
	case code == http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case code == http.StatusConflict || code == http.StatusPreconditionFailed:
		return errdefs.ErrConflict
	case code >= 500:
		return errdefs.ErrUnavailable
	case code >= 400:
		return errdefs.ErrInvalidArgument
	}
	return errdefs.ErrUnknown
}

func transientStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
}

// statusOf extracts an HTTP status code from the error types of the store
// clients (ours, minio-go, oras-go); 0 when there is none.
func statusOf(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode
	}
	var me minio.ErrorResponse
	if errors.As(err, &me) && me.StatusCode != 0 {
		return me.StatusCode
	}
	var oe *errcode.ErrorResponse
	if errors.As(err, &oe) {
		return oe.StatusCode
	}
	return 0
}

// isTransient reports whether a failed request is worth retrying: server
// errors, throttling, stalls, resets and truncated bodies; never 4xx answers
// such as 404 or 403, and never a cancelled caller.
func isTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errStalled) {
		return true
	}
	if code := statusOf(err); code != 0 {
		return transientStatus(code)
	}
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrPermissionDenied) ||
		errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrNotImplemented) {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errdefs.ErrUnavailable) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// checkStatus turns a non-2xx response into a *StatusError (closing the body).
func checkStatus(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	resp.Body.Close()
	return &StatusError{Op: resp.Request.Method + " " + redact.URL(resp.Request.URL.String()), StatusCode: resp.StatusCode}
}
