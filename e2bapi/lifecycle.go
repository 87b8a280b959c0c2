package e2bapi

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
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
// pauses them when they were created with autoPause. A sandbox that ended
// on its own (its pod Failed or Succeeded: its VM or its container died)
// is gone for the API at once (assemble), and removed by the reaper at its
// timeout as a kill removes it, whatever its onTimeout: there is nothing
// left to pause. Until then its pod stays for whoever wants to know why it
// died (kubectl describe, its events and logs). A sandbox gone with its
// resumed pod (resumedGone) is removed in the same way, at the end time
// its resume gave it, and so is one whose pod went while its newest
// Checkpoint had failed (failedGone), at the end its pod had
// (reapCheckpointed). The reaper runs on the leader only, so that two
// replicas never pause one sandbox twice.
type Reaper struct {
	Server *Server
	// Cache is what each tick reads (required): the Gateway's, holding
	// the sandbox pods and the Checkpoints, indexed by IndexSandboxes.
	// A tick costs the API server nothing until a sandbox's end has
	// passed there; then its namespace's objects are read once before
	// acting (Reap).
	Cache client.Reader
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

// Reap ends every expired sandbox once: a running one is killed or
// paused, an ended one removed. Cache picks the candidates: an expired
// pod that is its sandbox's newest live one and not already being paused,
// or the pod an ended sandbox ended with. Only then is the sandbox read
// from the API server, and the decision made again on that: the cache may
// not yet show a timeout just extended (setTimeout, connect) or a pause
// just begun, and acting on a stale view would kill a sandbox its owner
// just kept, or pause one twice.
func (r *Reaper) Reap(ctx context.Context) {
	s := r.Server
	var pods corev1.PodList
	if err := r.Cache.List(ctx, &pods, client.HasLabels{LabelSandbox}); err != nil {
		s.Log.Error(err, "e2b reaper: cached pods")
		return
	}
	now := s.now()
	for i := range pods.Items {
		p := &pods.Items[i]
		id := p.Labels[LabelSandbox]
		if !expired(p, now) {
			continue
		}
		sb := r.confirm(ctx, p.Namespace, id, func(sb *sandbox) bool { return due(sb, p.Name, now) })
		if sb == nil {
			continue
		}
		if sb.pod != nil && sb.pod.Annotations[annAutoPause] == "true" {
			go func() {
				if err := s.checkpoint(ctx, sb); err != nil {
					s.Log.Error(err, "e2b reaper: pause", "namespace", p.Namespace, "sandbox", sb.id)
				}
			}()
			continue
		}
		if err := s.remove(ctx, sb); err != nil {
			s.Log.Error(err, "e2b reaper: kill", "namespace", p.Namespace, "sandbox", sb.id)
			continue
		}
		if e := endedPod(sb); e != nil {
			s.Log.Info("ended sandbox removed at its timeout", "namespace", p.Namespace, "sandbox", sb.id, "pod", e.Name, "phase", e.Status.Phase)
			continue
		}
		s.Log.Info("sandbox timed out", "namespace", p.Namespace, "sandbox", sb.id)
	}
	r.reapCheckpointed(ctx, now)
}

// reapCheckpointed removes, as a kill does, the sandboxes gone with their
// pod that may have no pod left for Reap's loop to find, so their newest
// Checkpoint is the candidate: one gone with its resumed pod
// (resumedGone) once the end time its resume gave it has passed, and one
// whose pod went while its newest Checkpoint had failed (failedGone) once
// the end its pod had has passed (the Checkpoint carries it, as a pause's
// does). As there, the cache picks and the API server confirms (lookup
// settles a resume's mark with a read of the pod). A resumed sandbox that
// runs on past that time (setTimeout) is not gone, and costs nothing but
// the cache's reads.
func (r *Reaper) reapCheckpointed(ctx context.Context, now time.Time) {
	s := r.Server
	var cps cryov1.CheckpointList
	if err := r.Cache.List(ctx, &cps, client.HasLabels{LabelSandbox}); err != nil {
		s.Log.Error(err, "e2b reaper: cached Checkpoints")
		return
	}
	for i := range cps.Items {
		c := &cps.Items[i]
		id := c.Labels[LabelSandbox]
		var due func(*sandbox) bool
		var why string
		switch {
		case c.Annotations[annResumedAs] != "" && passed(c, annResumedEndAt, now):
			due = func(sb *sandbox) bool { return resumedDue(sb, c.Name, now) }
			why = "sandbox whose resumed pod was deleted removed at its timeout"
		case c.Status.Phase == cryov1.PhaseFailed && passed(c, annEndAt, now):
			due = func(sb *sandbox) bool { return failedDue(sb, c.Name, now) }
			why = "sandbox whose pod was deleted after a failed pause removed at its timeout"
		default:
			continue
		}
		sb := r.confirm(ctx, c.Namespace, id, due)
		if sb == nil {
			continue
		}
		if err := s.remove(ctx, sb); err != nil {
			s.Log.Error(err, "e2b reaper: kill", "namespace", c.Namespace, "sandbox", id)
			continue
		}
		s.Log.Info(why, "namespace", c.Namespace, "sandbox", id, "checkpoint", c.Name)
	}
}

// failedDue: sb is gone after a failed pause (failedGone), its newest
// Checkpoint is name, and the end its pod had has passed.
func failedDue(sb *sandbox, name string, now time.Time) bool {
	return failedGone(sb) && sb.last.Name == name && passed(sb.last, annEndAt, now)
}

// failedGone: sb has no pod left, not even an ended one, and its newest
// Checkpoint failed: a pause failed and then its pod was deleted outside
// the API (the API deletes a failed pause's Checkpoint when it sees it
// fail, unless it stopped first). Such a sandbox is not found (assemble),
// as one gone with its resumed pod: its older Checkpoints are states its
// owner went past.
func failedGone(sb *sandbox) bool {
	return sb != nil && sb.pod == nil && len(livePods(sb.pods)) == 0 &&
		sb.last != nil && sb.last.Status.Phase == cryov1.PhaseFailed
}

// resumedDue: sb is gone with its resumed pod (resumedGone), its newest
// Checkpoint is name, and the end time its resume gave it has passed.
func resumedDue(sb *sandbox, name string, now time.Time) bool {
	return resumedGone(sb) != "" && sb.last.Name == name && passed(sb.last, annResumedEndAt, now)
}

// passed: o's time annotation ann has passed and o is not being deleted.
func passed(o metav1.Object, ann string, now time.Time) bool {
	end, err := time.Parse(time.RFC3339Nano, o.GetAnnotations()[ann])
	return o.GetDeletionTimestamp() == nil && err == nil && !now.Before(end)
}

// confirm is sandbox id in ns as the API server has it, if both Cache
// and then the API server find it due; nil otherwise (errors logged).
// Cache picks for nothing; the API server has the last word, because
// Cache may not yet show a timeout just extended or a pause just begun.
func (r *Reaper) confirm(ctx context.Context, ns, id string, due func(*sandbox) bool) *sandbox {
	s := r.Server
	cached, err := r.cached(ctx, ns, id)
	if err != nil {
		s.Log.Error(err, "e2b reaper: cached sandbox", "namespace", ns, "sandbox", id)
		return nil
	}
	if !due(cached) {
		return nil
	}
	sb, _, err := s.lookup(ctx, ns, id)
	if err != nil {
		s.Log.Error(err, "e2b reaper: read sandbox", "namespace", ns, "sandbox", id)
		return nil
	}
	if !due(sb) {
		return nil
	}
	return sb
}

// cached is what Cache holds of sandbox id in ns.
func (r *Reaper) cached(ctx context.Context, ns, id string) (*sandbox, error) {
	pods, cps, err := sandboxObjects(ctx, r.Cache, client.InNamespace(ns), client.MatchingFields{IndexSandbox: id})
	if err != nil {
		return nil, err
	}
	sb, _ := assemble(ns, id, pods, cps)
	return sb, nil
}

// due: pod name is sb's newest live pod, its end has passed, and no pause
// of it is under way (a Checkpoint of its name that has not failed: the
// API names a pause after its pod); or sb ended with pod name, and its
// end has passed. A pause under way wins over a kill: its owner asked for
// it, and killing would fail it half way.
func due(sb *sandbox, name string, now time.Time) bool {
	if e := endedPod(sb); e != nil {
		return e.Name == name && expired(e, now)
	}
	return sb.pod != nil && sb.pod.Name == name && expired(sb.pod, now) &&
		!(sb.last != nil && sb.last.Name == name && sb.last.Status.Phase != cryov1.PhaseFailed)
}

// expired: the pod's end time has passed and it is not being deleted.
func expired(p *corev1.Pod, now time.Time) bool {
	end, err := time.Parse(time.RFC3339Nano, p.Annotations[annEndAt])
	return p.DeletionTimestamp == nil && err == nil && !now.Before(end)
}

// endedPod is the pod sb ended with, nil when sb has not ended. A sandbox
// ends when its VM or its container dies: its newest pod (the highest
// generation of those not being deleted) is Failed or Succeeded, and
// nothing pauses or paused it there (a Checkpoint of that pod's name
// that has not failed: keepRunning false stops the VM before the pod is
// deleted; or a newer Checkpoint). As on E2B, an ended sandbox is gone:
// not found, not listed, not routed to, and never resumed from an earlier
// pause, which would bring back a state its owner went past without
// saying so.
func endedPod(sb *sandbox) *corev1.Pod {
	if sb == nil || sb.pod != nil {
		return nil
	}
	var newest *corev1.Pod
	for i := range sb.pods {
		p := &sb.pods[i]
		if p.DeletionTimestamp == nil && (newest == nil || generation(p.Annotations) > generation(newest.Annotations)) {
			newest = p
		}
	}
	if newest == nil || !podEnded(newest) {
		return nil
	}
	for i := range sb.all {
		c := &sb.all[i]
		if (c.Name == newest.Name && c.Status.Phase != cryov1.PhaseFailed) || generation(c.Annotations) > generation(newest.Annotations) {
			return nil
		}
	}
	return newest
}

// resumedGone is the pod that sb's newest state went with, "" when
// there is none: sb's newest Checkpoint, a pause's that Succeeded, was
// resumed as pod P (annResumedAs, the next generation's name), P is gone
// or being deleted, and nothing newer exists (a pause of P would be a
// newer Checkpoint, named P). So P was deleted outside a pause (kubectl
// delete, an eviction, a node drain), and the state it ran on to went
// with it. As for a sandbox that ended (endedPod), E2B's sandbox whose VM
// is gone is gone: resuming the Checkpoint again would bring back a state
// its owner went past without saying so. An ended P that is still there
// is endedPod's. The mark alone is no proof: lists (a cache's, or the API
// server's pods then Checkpoints) can show it before P, so the API
// settles it with a read of P before acting on it (settle).
func resumedGone(sb *sandbox) string {
	if sb == nil || sb.pod != nil || sb.last == nil || sb.last.Status.Phase != cryov1.PhaseSucceeded {
		return ""
	}
	p := sb.last.Annotations[annResumedAs]
	if p == "" || p != podName(sb.id, generation(sb.last.Annotations)+1) {
		return "" // not a mark the API wrote
	}
	for i := range sb.pods {
		if sb.pods[i].Name == p && sb.pods[i].DeletionTimestamp == nil {
			return ""
		}
	}
	return p
}

// podEnded: p's containers have all stopped for good (restartPolicy
// Never): its VM or container died.
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
