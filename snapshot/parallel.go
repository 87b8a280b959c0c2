package snapshot

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"golang.org/x/sync/errgroup"
)

// readCodec returns a decoding codec for this snapshot, its decryption key
// (nil for plaintext) and how many workers fit in opts.MaxMemory at
// perWorker bytes each, at most jobs.
func (s *Snapshot) readCodec(perWorker int64, jobs int) (*chunkCodec, []byte, int, error) {
	var key []byte
	if s.Encrypted() {
		if s.opts.DecryptionKey == nil {
			return nil, nil, 0, fmt.Errorf("encrypted snapshot and no decryption key: %w", errdefs.ErrFailedPrecondition)
		}
		key = s.opts.DecryptionKey
	}
	workers := max(min(s.opts.Workers, int(s.opts.MaxMemory/perWorker), jobs), 1)
	codec, err := newChunkCodec(s.Metadata.ChunkSize, key, 0, workers, false)
	if err != nil {
		return nil, nil, 0, err
	}
	if key != nil {
		codec.lineage = s.Metadata.Encryption.Lineage
	}
	return codec, key, workers, nil
}

// inParallel feeds items to n workers and returns the first error; the
// others then stop at their next item. Each worker ranges over jobs with
// its own buffers.
func inParallel[T any](ctx context.Context, items []T, n int, worker func(ctx context.Context, jobs <-chan T) error) error {
	g, ctx := errgroup.WithContext(ctx)
	jobs := make(chan T)
	g.Go(func() error {
		defer close(jobs)
		for _, it := range items {
			select {
			case jobs <- it:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	for range n {
		g.Go(func() error { return worker(ctx, jobs) })
	}
	return g.Wait()
}
