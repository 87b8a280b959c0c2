package e2bapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// forkResult is the SDK's SandboxForkResult: one of the two is set.
type forkResult struct {
	Sandbox *sandboxBody `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is a snapshot of the running sandbox (keepRunning true: it runs on,
// its id and end time untouched) restored count times, each under a new
// sandbox id with the source's envd token and metadata. A paused sandbox
// forks from its pause Checkpoint, which already is its state. The
// snapshot stays (listSnapshots shows it, deleteSnapshot removes it):
// the forks' memory is read from it lazily.
func (s *Server) fork(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	count := 1
	if b.Count != nil {
		count = *b.Count
	}
	if count < 1 || count > maxForks {
		return 0, nil, errf(http.StatusBadRequest, "count: %d is outside 1..%d", count, maxForks)
	}
	timeout, err := timeoutOf(b.Timeout)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	cp := sb.last
	if sb.pod != nil {
		if cp, err = s.snapshot(ctx, sb, "", "fork of sandbox "+sb.id); err != nil {
			return 0, nil, err
		}
	}
	results := make([]forkResult, count)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = s.forkOne(ctx, ns, cp, sb.annotations(), timeout) })
	}
	wg.Wait()
	return http.StatusCreated, results, nil
}

// forkOne starts one restore of cp; its failure is its entry's error.
func (s *Server) forkOne(ctx context.Context, ns string, cp *cryov1.Checkpoint, src map[string]string, timeout time.Duration) forkResult {
	now := s.now()
	l := launch{
		ns: ns, id: s.newID(), newSecret: true, ann: map[string]string{
			annStartedAt: now.UTC().Format(time.RFC3339Nano),
			annEndAt:     now.Add(timeout).UTC().Format(time.RFC3339Nano),
			annAutoPause: strconv.FormatBool(src[annAutoPause] == "true"),
			annMetadata:  src[annMetadata],
			annGen:       "0",
		},
	}
	err := s.fromCheckpoint(ctx, &l, cp.Name, nil)
	if err == nil {
		l.ann[annEnv] = jsonString(l.env)
		err = s.start(ctx, l)
	}
	if err != nil {
		var he *httpError
		if !errors.As(err, &he) {
			he = &httpError{code: http.StatusInternalServerError, msg: err.Error()}
		}
		s.Log.Error(err, "fork", "namespace", ns, "checkpoint", cp.Name)
		return forkResult{Error: &apiError{Code: he.code, Message: he.msg}}
	}
	s.Log.Info("sandbox forked", "namespace", ns, "sandbox", l.id, "checkpoint", cp.Name)
	body := s.sandboxBody(l.id, cp.Name, l.token)
	return forkResult{Sandbox: &body}
}
