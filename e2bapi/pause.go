package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

// Pause and resume: a pause is a Checkpoint with keepRunning false, a
// resume (connect) a new pod restoring it under the same sandbox id.

func (s *Server) pause(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Memory *bool `json:"memory"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.Memory != nil && !*b.Memory {
		return 0, nil, errf(http.StatusBadRequest, "memory: false (a pause without memory) is not supported: cryo always keeps the memory")
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.pod == nil {
		return 0, nil, errf(http.StatusConflict, "sandbox %q is already paused", sb.id)
	}
	if err := s.checkpoint(ctx, sb); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// checkpoint hibernates a running sandbox: a Checkpoint with keepRunning
// false carrying the sandbox's E2B annotations, then waits until it has
// Succeeded and the pod is gone, so that the SDK's pause returns with the
// sandbox paused.
func (s *Server) checkpoint(ctx context.Context, sb *sandbox) error {
	ann := map[string]string{}
	for k, v := range sb.pod.Annotations {
		if strings.HasPrefix(k, e2bAnnotationPrefix) {
			ann[k] = v
		}
	}
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   sb.pod.Namespace,
			Name:        sb.pod.Name,
			Labels:      map[string]string{LabelSandbox: sb.id},
			Annotations: ann,
		},
		Spec: cryov1.CheckpointSpec{PodName: sb.pod.Name, KeepRunning: ptr(false)},
	}
	if err := s.Client.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Checkpoint: %w", err)
	}
	s.Log.Info("sandbox pausing", "namespace", cp.Namespace, "sandbox", sb.id, "checkpoint", cp.Name)
	if _, err := s.waitCheckpoint(ctx, cp, "pause of sandbox "+sb.id); err != nil {
		return err
	}
	// keepRunning false: the controller deletes the pod once the snapshot
	// is safe; the pause is done when it is gone. The pod has been there
	// all along, so the cache's miss is asked about at once: the API
	// server's NotFound is the one that counts.
	wait := s.pauseWait()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	w := s.watch(client.ObjectKeyFromObject(sb.pod), sb.pod.UID, true)
	for {
		_, err := read[corev1.Pod](ctx, w)
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return errf(http.StatusGatewayTimeout, "pause of sandbox %s: pod %s still there %s after its Checkpoint succeeded", sb.id, sb.pod.Name, wait)
		case <-time.After(s.poll()):
		}
	}
}

func (s *Server) pauseWait() time.Duration {
	if s.PauseWait > 0 {
		return s.PauseWait
	}
	return 5 * time.Minute
}

// waitCheckpoint waits until cp has Succeeded. A failed one is deleted,
// so that the next attempt can reuse its name, and the error carries the
// controller's reason. It reads cp from Server.Cache (see watched), which
// shows cp a moment after its create.
func (s *Server) waitCheckpoint(ctx context.Context, cp *cryov1.Checkpoint, what string) (*cryov1.Checkpoint, error) {
	wait := s.pauseWait()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	w := s.watch(client.ObjectKeyFromObject(cp), cp.UID, false)
	var cur cryov1.Checkpoint // as last read
	for {
		c, err := read[cryov1.Checkpoint](ctx, w)
		switch {
		case err == nil:
			cur = *c
		case !errors.Is(err, errNotCached):
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		switch cur.Status.Phase {
		case cryov1.PhaseSucceeded:
			return &cur, nil
		case cryov1.PhaseFailed:
			// This one only: the cache may lag behind a newer attempt.
			var pre []client.DeleteOption
			if cur.UID != "" {
				pre = append(pre, client.Preconditions{UID: &cur.UID})
			}
			if err := s.Client.Delete(context.WithoutCancel(ctx), &cur, pre...); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				s.Log.Error(err, "delete failed Checkpoint", "checkpoint", cp.Name)
			}
			return nil, fmt.Errorf("%s: Checkpoint %s failed: %s: %s", what, cp.Name, cur.Status.Reason, cur.Status.Message)
		}
		select {
		case <-ctx.Done():
			return nil, errf(http.StatusGatewayTimeout, "%s: Checkpoint %s not done after %s (phase %q)", what, cp.Name, wait, cur.Status.Phase)
		case <-time.After(s.poll()):
		}
	}
}

func (s *Server) poll() time.Duration {
	if s.PollInterval > 0 {
		return s.PollInterval
	}
	return 250 * time.Millisecond
}

func (s *Server) connect(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.Memory != nil && !*b.Memory {
		return 0, nil, errf(http.StatusBadRequest, "memory: false (onResume reboot) is not supported: cryo always restores the memory")
	}
	// E2B's connect: no timeout (the SDK sends none unless asked) is the
	// default lifetime, and a running sandbox's is only ever extended.
	sec := int64(defaultTimeout / time.Second)
	if b.Timeout != nil && *b.Timeout > 0 {
		sec = *b.Timeout
	}
	timeout, err := timeoutOf(&sec)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.findSettled(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	ann := sb.annotations()
	token, err := s.token(ctx, ns, tokenSecretName(sb.id))
	if err != nil {
		return 0, nil, err
	}
	tid := templateID(ann)
	if sb.pod != nil {
		// A pod another call is starting: the SDK talks to envd next.
		if sb.pod.Status.Phase != corev1.PodRunning || sb.pod.Status.PodIP == "" {
			if _, err := s.waitRunning(ctx, ns, sb.pod.Name, sb.pod.UID); err != nil {
				return 0, nil, err
			}
		}
		if err := s.extendEndAt(ctx, sb, timeout); err != nil {
			return 0, nil, err
		}
		return http.StatusOK, s.sandboxBody(sb.id, tid, token), nil
	}
	if err := s.resume(ctx, sb, timeout, token); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.sandboxBody(sb.id, tid, token), nil
}

// findSettled is connect's lookup: a sandbox whose pause is under way (its
// own, autoPause's or another client's) is found once the pause is done,
// paused, or running again if it failed. E2B's connect also waits for the
// sandbox's state change, then resumes it: answering "running" during the
// pause would hand the SDK a sandbox about to stop.
func (s *Server) findSettled(ctx context.Context, ns, id string) (*sandbox, error) {
	wait := s.pauseWait()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		sb, found, err := s.lookup(ctx, ns, id)
		switch {
		case err != nil:
			return nil, err
		case found && !pausing(sb):
			return sb, nil
		case !found && !pausingSandbox(sb):
			return nil, errf(http.StatusNotFound, "sandbox %q not found", id)
		}
		select {
		case <-ctx.Done():
			return nil, errf(http.StatusGatewayTimeout, "connect to sandbox %s: its pause was not done after %s", id, wait)
		case <-time.After(s.poll()):
		}
	}
}

// extendEndAt moves a running sandbox's end time to timeout from now,
// unless it is later already: connecting never shortens a lifetime that
// setTimeout or an earlier connect gave.
func (s *Server) extendEndAt(ctx context.Context, sb *sandbox, timeout time.Duration) error {
	at := s.now().Add(timeout)
	if end, err := time.Parse(time.RFC3339Nano, sb.pod.Annotations[annEndAt]); err == nil && !at.After(end) {
		return nil
	}
	return s.setEndAt(ctx, sb, at)
}

// templateID is what the SDK is shown as a sandbox's template: the
// Checkpoint it was created from, else the template's name.
func templateID(ann map[string]string) string {
	if f := ann[annFrom]; f != "" {
		return f
	}
	return ann[annTemplate]
}

// resume starts the next generation's pod restoring the newest
// Checkpoint, with the token the restored guest's envd already holds.
func (s *Server) resume(ctx context.Context, sb *sandbox, timeout time.Duration, token string) error {
	cp := sb.last
	tpl, ok := s.Templates[cp.Annotations[annTemplate]]
	if !ok {
		return errf(http.StatusInternalServerError, "template %q of paused sandbox %s is no longer configured", cp.Annotations[annTemplate], sb.id)
	}
	var env map[string]string
	_ = json.Unmarshal([]byte(cp.Annotations[annEnv]), &env)
	gen := generation(cp.Annotations) + 1
	ann := map[string]string{}
	for k, v := range cp.Annotations {
		if strings.HasPrefix(k, e2bAnnotationPrefix) {
			ann[k] = v
		}
	}
	// The marks are of this Checkpoint, not of the sandbox's state.
	delete(ann, annResumedAs)
	delete(ann, annResumedEndAt)
	ann[annGen] = strconv.Itoa(gen)
	ann[annEndAt] = s.now().Add(timeout).UTC().Format(time.RFC3339Nano)
	ann[controller.AnnotationRestoreCheckpoint] = cp.Name
	l := launch{ns: cp.Namespace, id: sb.id, gen: gen, tpl: tpl, podEnv: env, env: env, ann: ann, token: token, resumes: cp}
	if err := s.start(ctx, l); err != nil {
		return err
	}
	s.Log.Info("sandbox resumed", "namespace", cp.Namespace, "sandbox", sb.id, "checkpoint", cp.Name, "pod", podName(sb.id, gen))
	return nil
}
