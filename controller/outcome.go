package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// fail ends the Checkpoint in Failed with the refusal's reason.
func (r *Reconciler) fail(ctx context.Context, cp *cryov1.Checkpoint, ref *refusal) (reconcile.Result, error) {
	now := r.now()
	cp.Status.Phase = cryov1.PhaseFailed
	cp.Status.Reason, cp.Status.Message = ref.reason, ref.message
	cp.Status.CompletionTime = &now
	setCondition(cp, cryov1.ConditionProgressing, metav1.ConditionFalse, ref.reason, ref.message)
	setCondition(cp, cryov1.ConditionReady, metav1.ConditionFalse, ref.reason, ref.message)
	r.setExpiry(cp)
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		return reconcile.Result{}, err
	}
	r.release(cp)
	r.event(cp, corev1.EventTypeWarning, ref.reason, "Checkpoint", "%s", ref.message)
	return r.expire(ctx, cp)
}

// failOrRetry fails on a refusal and retries (by error, with the work
// queue's backoff) anything else, saying why in the status: a Checkpoint
// that stays Pending while its store does not answer names the store's
// error, and so does its Timeout.
func (r *Reconciler) failOrRetry(ctx context.Context, cp *cryov1.Checkpoint, err error) (reconcile.Result, error) {
	var ref *refusal
	if errors.As(err, &ref) {
		return r.fail(ctx, cp, ref)
	}
	if res, done := r.pastDeadline(ctx, cp); done {
		return res, nil
	}
	r.setMessage(ctx, cp, "retrying: "+err.Error())
	return reconcile.Result{}, err
}

// storeErr turns a store error into a refusal unless it is transient.
func storeErr(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if transientStore(err) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return refuse(cryov1.ReasonSnapshotNotFound, "%s: %v", what, err)
}

// pastDeadline fails the Checkpoint with Timeout once its deadline passed.
func (r *Reconciler) pastDeadline(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, bool) {
	if cp.Status.StartTime == nil || r.Now().Before(cp.Status.StartTime.Add(r.Deadline)) {
		return reconcile.Result{}, false
	}
	msg := fmt.Sprintf("not done %s after it started", r.Deadline)
	if cp.Status.Message != "" {
		msg += "; last: " + cp.Status.Message
	}
	res, err := r.fail(ctx, cp, &refusal{reason: cryov1.ReasonTimeout, message: msg})
	if err != nil {
		return reconcile.Result{RequeueAfter: time.Second}, true
	}
	return res, true
}

// setExpiry sets status.expireTime from ttlAfterFinished.
func (r *Reconciler) setExpiry(cp *cryov1.Checkpoint) {
	ttl, err := ParseTTL(cp.Spec.TTLAfterFinished)
	if cp.Spec.TTLAfterFinished == "" || err != nil || cp.Status.CompletionTime == nil {
		return
	}
	t := metav1.NewTime(cp.Status.CompletionTime.Add(ttl))
	cp.Status.ExpireTime = &t
}

// expire deletes a finished Checkpoint whose TTL passed (its finalizer
// then untags the snapshot).
func (r *Reconciler) expire(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	if cp.Status.ExpireTime == nil {
		if r.setExpiry(cp); cp.Status.ExpireTime == nil {
			return reconcile.Result{}, nil
		}
		if err := r.Client.Status().Update(ctx, cp); err != nil {
			return reconcile.Result{}, err
		}
	}
	if left := cp.Status.ExpireTime.Sub(r.Now()); left > 0 {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	r.event(cp, corev1.EventTypeNormal, "Expired", "Delete", "ttlAfterFinished %s passed", cp.Spec.TTLAfterFinished)
	return reconcile.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, cp))
}

// finalize removes the Checkpoint's tag (only cp-<uid>) from the store,
// then the finalizer.
func (r *Reconciler) finalize(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	r.release(cp)
	r.mu.Lock()
	delete(r.asked, cp.UID) // a call still running keeps its own
	r.mu.Unlock()
	if !controllerutil.ContainsFinalizer(cp, Finalizer) {
		return reconcile.Result{}, nil
	}
	if repo, ok := taggedRepo(cp); ok {
		store, _, err := r.Open(ctx, repo)
		if err == nil {
			err = store.Untag(ctx, checkpointTag(cp))
		}
		if err != nil && !errdefs.IsNotFound(err) {
			if transientStore(err) {
				r.event(cp, corev1.EventTypeWarning, "UntagFailed", "Delete", "untag %s:%s, retrying: %v", repo, checkpointTag(cp), err)
				return reconcile.Result{}, fmt.Errorf("untag %s:%s: %w", repo, checkpointTag(cp), err)
			}
			// A store that refuses us (credentials gone, store
			// removed) must not keep the resource forever: say so.
			r.event(cp, corev1.EventTypeWarning, "UntagFailed", "Delete", "untag %s:%s: %v", repo, checkpointTag(cp), err)
		}
	}
	controllerutil.RemoveFinalizer(cp, Finalizer)
	return reconcile.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, cp))
}

// taggedRepo is the repository that may hold cp's tag: its snapshot's, or,
// for a Checkpoint deleted while Creating, its target's (record tags the
// snapshot before its status says so, and a deletion can fail that write).
func taggedRepo(cp *cryov1.Checkpoint) (string, bool) {
	if repo, _, ok := splitSnapshot(cp.Status.Snapshot); ok {
		return repo, true
	}
	if cp.Status.Target == "" {
		return "", false
	}
	repo, _, err := splitTarget(cp.Status.Target)
	return repo, err == nil
}
