package stores

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"github.com/cryo-runtime/cryo/internal/redact"
)

// reliableStore wraps a backend store with retries on transient errors, a
// stall timeout per request, resumption of interrupted downloads at the byte
// they stopped at, and a bound on concurrent downloads.
type reliableStore struct {
	s    Store
	opts Options
	sem  *semaphore.Weighted
}

var _ Store = (*reliableStore)(nil)

func newReliableStore(s Store, opts Options) *reliableStore {
	opts = opts.withDefaults()
	return &reliableStore{s: s, opts: opts, sem: semaphore.NewWeighted(int64(opts.MaxConcurrent))}
}

// Unwrap returns the backend store.
func (r *reliableStore) Unwrap() Store { return r.s }

// retry runs op until it succeeds, fails permanently, or runs out of retries.
// Its errors, and the retries it logs, are redacted: a store client's
// message may quote a URL with credentials or a signature.
func (r *reliableStore) retry(ctx context.Context, what string, op func(ctx context.Context) error) error {
	var err error
	for attempt := 0; ; attempt++ {
		if err = op(ctx); err == nil || !isTransient(err) || ctx.Err() != nil {
			return redact.Error(err)
		}
		err = redact.Error(err)
		if attempt >= r.opts.Retries {
			return fmt.Errorf("%s: giving up after %d attempts: %w", what, attempt+1, err)
		}
		if werr := r.backoff(ctx, what, attempt, err); werr != nil {
			return err
		}
	}
}

func (r *reliableStore) backoff(ctx context.Context, what string, attempt int, err error) error {
	d := r.opts.RetryBackoff << attempt
	if d > r.opts.MaxBackoff || d <= 0 {
		d = r.opts.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1) // jitter: [d/2, d]
	log.G(ctx).WithError(err).WithField("attempt", attempt+1).Debugf("%s: retrying in %s", what, d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (r *reliableStore) Exists(ctx context.Context, desc ocispec.Descriptor) (ok bool, err error) {
	err = r.retry(ctx, "exists "+desc.Digest.String(), func(ctx context.Context) (err error) {
		ok, err = r.s.Exists(ctx, desc)
		return err
	})
	return ok, err
}

func (r *reliableStore) Resolve(ctx context.Context, ref string) (d ocispec.Descriptor, err error) {
	err = r.retry(ctx, "resolve "+ref, func(ctx context.Context) (err error) {
		d, err = r.s.Resolve(ctx, ref)
		return err
	})
	return d, err
}

func (r *reliableStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	return r.retry(ctx, "tag "+ref, func(ctx context.Context) error { return r.s.Tag(ctx, desc, ref) })
}

func (r *reliableStore) Tags(ctx context.Context) (tags []string, err error) {
	err = r.retry(ctx, "list tags", func(ctx context.Context) (err error) {
		tags, err = r.s.Tags(ctx)
		return err
	})
	return tags, err
}

func (r *reliableStore) Untag(ctx context.Context, ref string) error {
	return r.retry(ctx, "untag "+ref, func(ctx context.Context) error { return r.s.Untag(ctx, ref) })
}

// Push retries only when r can be rewound (an io.Seeker); otherwise the
// first error is returned.
func (r *reliableStore) Push(ctx context.Context, desc ocispec.Descriptor, rd io.Reader) error {
	seeker, canRewind := rd.(io.Seeker)
	if !canRewind {
		return r.s.Push(ctx, desc, rd)
	}
	return r.retry(ctx, "push "+desc.Digest.String(), func(ctx context.Context) error {
		if _, err := seeker.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("push %s: rewind: %w", desc.Digest, err)
		}
		return r.s.Push(ctx, desc, rd)
	})
}

// Fetch opens the first request at once, so a missing blob fails here, and
// returns a reader that reconnects (with a Range from where it stopped) when
// the stream breaks or stalls.
func (r *reliableStore) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	if offset < 0 || (desc.Size > 0 && offset > desc.Size) {
		return nil, fmt.Errorf("fetch %s: offset %d out of range", desc.Digest, offset)
	}
	if length == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	rr := &resumingReader{r: r, ctx: ctx, desc: desc, pos: offset, end: -1}
	if length >= 0 {
		rr.end = offset + length
	} else if desc.Size > 0 {
		rr.want = desc.Size
	}
	if err := rr.reopen(); err != nil {
		return nil, err
	}
	return rr, nil
}

// maxRetriesPerBlob bounds the reconnects of one download that keeps
// making a little progress between failures.
const maxRetriesPerBlob = 100

// resumingReader is one logical download made of one or more requests.
type resumingReader struct {
	r    *reliableStore
	ctx  context.Context
	desc ocispec.Descriptor
	pos  int64 // next byte to read
	end  int64 // exclusive end for ranged reads; -1 = to the end of the blob
	want int64 // for reads to the end: the size the blob should have (0 = unknown)

	body     io.ReadCloser
	actx     context.Context // context of the current request
	cancel   context.CancelCauseFunc
	watchdog *time.Timer
	attempt  int // retries since the last byte received
	retries  int // retries in all, bounded by maxRetriesPerBlob
	held     bool
	closed   bool
	mu       sync.Mutex
}

// open starts one request from pos, holding a concurrency slot until it ends.
func (rr *resumingReader) open() error {
	if err := rr.r.sem.Acquire(rr.ctx, 1); err != nil {
		return err
	}
	rr.held = true
	actx, cancel := context.WithCancelCause(rr.ctx)
	rr.actx, rr.cancel = actx, cancel
	rr.watchdog = time.AfterFunc(rr.r.opts.StallTimeout, func() { cancel(errStalled) })
	length := int64(-1)
	if rr.end >= 0 {
		length = rr.end - rr.pos
	}
	body, err := rr.r.s.Fetch(actx, rr.desc, rr.pos, length)
	rr.watchdog.Stop() // re-armed around each Read: a slow consumer is not a stall
	if err != nil {
		err = rr.causeOf(actx, err)
		rr.release()
		return err
	}
	if length >= 0 {
		body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(body, length), body}
	}
	rr.body = body
	return nil
}

// causeOf returns errStalled when the watchdog cut the request.
func (rr *resumingReader) causeOf(actx context.Context, err error) error {
	if cause := context.Cause(actx); errors.Is(cause, errStalled) && rr.ctx.Err() == nil {
		return fmt.Errorf("fetch %s at offset %d: no data for %s: %w", rr.desc.Digest, rr.pos, rr.r.opts.StallTimeout, errStalled)
	}
	return err
}

func (rr *resumingReader) release() {
	if rr.watchdog != nil {
		rr.watchdog.Stop()
	}
	if rr.body != nil {
		rr.body.Close()
		rr.body = nil
	}
	if rr.cancel != nil {
		rr.cancel(context.Canceled)
	}
	if rr.held {
		rr.r.sem.Release(1)
		rr.held = false
	}
}

// reopen (re)starts the request, retrying transient failures with backoff.
func (rr *resumingReader) reopen() error {
	for {
		err := rr.open()
		if errdefs.IsOutOfRange(err) && rr.pos > 0 && rr.pos < max(rr.end, rr.want) {
			return fmt.Errorf("fetch %s: store object ends at %d, before %d: %w: %w", rr.desc.Digest, rr.pos, max(rr.end, rr.want), io.ErrUnexpectedEOF, err)
		}
		if err == nil || !isTransient(err) || rr.ctx.Err() != nil {
			return err
		}
		if err := rr.retryWait(err); err != nil {
			return err
		}
	}
}

func (rr *resumingReader) retryWait(err error) error {
	what := fmt.Sprintf("fetch %s", rr.desc.Digest)
	if rr.attempt >= rr.r.opts.Retries {
		return fmt.Errorf("%s: giving up after %d attempts: %w", what, rr.attempt+1, err)
	}
	if rr.retries >= maxRetriesPerBlob {
		return fmt.Errorf("%s: giving up after %d interruptions: %w", what, rr.retries, err)
	}
	rr.retries++
	if werr := rr.r.backoff(rr.ctx, what, rr.attempt, err); werr != nil {
		return err
	}
	rr.attempt++
	return nil
}

func (rr *resumingReader) Read(p []byte) (int, error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.closed {
		return 0, errors.New("read on closed blob reader")
	}
	for {
		if rr.end >= 0 && rr.pos >= rr.end {
			return 0, io.EOF
		}
		if rr.body == nil {
			if err := rr.reopen(); err != nil {
				return 0, err
			}
		}
		rr.watchdog.Reset(rr.r.opts.StallTimeout)
		n, err := rr.body.Read(p)
		rr.watchdog.Stop()
		rr.pos += int64(n)
		if err == io.EOF {
			short := (rr.end >= 0 && rr.pos < rr.end) || (rr.want > 0 && rr.pos < rr.want)
			if !short {
				return n, io.EOF
			}
			err = fmt.Errorf("fetch %s: stream ended at offset %d: %w", rr.desc.Digest, rr.pos, io.ErrUnexpectedEOF)
		}
		if err == nil {
			if n > 0 {
				rr.attempt = 0 // progress: the retry budget is per interruption
			}
			return n, nil
		}
		err = rr.causeOf(rr.actx, err)
		rr.release()
		if !isTransient(err) || rr.ctx.Err() != nil {
			return n, err
		}
		if werr := rr.retryWait(err); werr != nil {
			return n, werr
		}
		if n > 0 {
			return n, nil // deliver what we have; the next Read reconnects
		}
	}
}

func (rr *resumingReader) Close() error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if !rr.closed {
		rr.closed = true
		rr.release()
	}
	return nil
}
