package e2bapi

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// parseQuery decodes the SDK's metadata filter: URLSearchParams of
// encodeURIComponent'd keys and values, so each part is unescaped twice.
func parseQuery(v string) (map[string]string, error) {
	q, err := url.ParseQuery(v)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, vs := range q {
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, err
		}
		val, err := url.QueryUnescape(vs[len(vs)-1])
		if err != nil {
			return nil, err
		}
		out[key] = val
	}
	return out, nil
}

// Listener serves the API on addr until ctx ends. It runs on every
// replica (no leader election): it keeps no state of its own.
type Listener struct {
	Server *Server
	Addr   string
}

func (l *Listener) NeedLeaderElection() bool { return false }

func (l *Listener) Start(ctx context.Context) error {
	srv := &http.Server{Handler: l.Server.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", l.Addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	l.Server.Log.Info("e2b API serving", "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}

// Reaper ends the sandboxes whose timeout has passed: it kills them, or
// pauses them when they were created with autoPause. It runs on the
// leader only, so that two replicas never pause one sandbox twice.
type Reaper struct {
	Server *Server
}

func (r *Reaper) Start(ctx context.Context) error {
	every := r.Server.ReapInterval
	if every == 0 {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.Reap(ctx)
		}
	}
}

// Reap ends every expired running sandbox once.
func (r *Reaper) Reap(ctx context.Context) {
	s := r.Server
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.HasLabels{LabelSandbox}); err != nil {
		s.Log.Error(err, "e2b reaper: list pods")
		return
	}
	now := s.now()
	for _, p := range pods.Items {
		end, err := time.Parse(time.RFC3339Nano, p.Annotations[annEndAt])
		if p.DeletionTimestamp != nil || err != nil || now.Before(end) {
			continue
		}
		sb, ok, err := s.lookup(ctx, p.Namespace, p.Labels[LabelSandbox])
		if err != nil || !ok || sb.pod == nil || sb.pod.Name != p.Name {
			continue
		}
		if p.Annotations[annAutoPause] == "true" {
			if sb.last != nil && sb.last.Name == p.Name {
				continue // its pause is under way
			}
			go func() {
				if err := s.checkpoint(ctx, sb); err != nil {
					s.Log.Error(err, "e2b reaper: pause", "namespace", p.Namespace, "sandbox", sb.id)
				}
			}()
			continue
		}
		if err := s.remove(ctx, sb); err != nil {
			s.Log.Error(err, "e2b reaper: kill", "namespace", p.Namespace, "sandbox", sb.id)
		}
		s.Log.Info("sandbox timed out", "namespace", p.Namespace, "sandbox", sb.id)
	}
}
