package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// waitingFor begins the message of a Checkpoint that waits for another
// of the same pod.
const waitingFor = "waiting for Checkpoint "

// waited says whether cp's last step was a wait to begin (its message).
func waited(cp *cryov1.Checkpoint) bool {
	return strings.HasPrefix(cp.Status.Message, waitingFor) || strings.HasPrefix(cp.Status.Message, waitingSlot)
}

// start checks the spec and the pod, then asks the kubelet.
func (r *Reconciler) start(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	if cp.Status.StartTime == nil {
		now := r.now()
		cp.Status.StartTime = &now
		cp.Status.Phase = cryov1.PhasePending
		if err := r.Client.Status().Update(ctx, cp); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := ValidateSpec(cp.Spec); err != nil {
		return r.fail(ctx, cp, refuse(cryov1.ReasonInvalidSpec, "%v", err))
	}
	pod, container, target, err := r.checkPod(ctx, cp)
	if err != nil {
		return r.failOrRetry(ctx, cp, err)
	}
	// The wait for another Checkpoint of the pod, or for a slot on its
	// node, is not this one's time: this one's deadline starts when it
	// may begin.
	if other, busy := r.claim(ctx, cp, pod); busy {
		r.setMessage(ctx, cp, waitingFor+other+" of the same pod")
		return reconcile.Result{RequeueAfter: waitOtherPod}, nil
	}
	if res, wait := r.waitForSlot(ctx, cp, pod); wait {
		return res, nil
	}
	if waited(cp) {
		// Saved at once: were it kept in memory until the Creating
		// write, a step that fails after it (a store that does not
		// answer) would leave the wait's message, and the next
		// reconcile would restart the deadline again, for ever.
		now := r.now()
		cp.Status.StartTime = &now
		cp.Status.Message = ""
		if err := r.Client.Status().Update(ctx, cp); err != nil {
			r.release(cp)
			return reconcile.Result{}, err
		}
	}
	if res, done := r.pastDeadline(ctx, cp); done {
		r.release(cp)
		return res, nil
	}
	store, tag, err := r.Open(ctx, target)
	if err != nil {
		r.release(cp)
		return r.failOrRetry(ctx, cp, storeErr(err, "open %s", target))
	}
	prior, err := currentDigest(ctx, store, tag)
	if err != nil {
		r.release(cp)
		return r.failOrRetry(ctx, cp, storeErr(err, "resolve %s", target))
	}
	cp.Status.Phase = cryov1.PhaseCreating
	cp.Status.Node = pod.Spec.NodeName
	cp.Status.PodUID = string(pod.UID)
	cp.Status.PriorDigest = prior
	cp.Status.Target = target
	cp.Status.Reason, cp.Status.Message = "", ""
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		r.release(cp)
		return reconcile.Result{}, err
	}
	r.event(cp, corev1.EventTypeNormal, "Creating", "Checkpoint", "checkpointing pod %s (container %s) on node %s", pod.Name, container, pod.Spec.NodeName)
	return r.ask(ctx, cp, pod, container, target)
}

// checkPod returns the pod, the container to ask for and the pod's
// checkpoint target, or the refusal.
func (r *Reconciler) checkPod(ctx context.Context, cp *cryov1.Checkpoint) (*corev1.Pod, string, string, error) {
	var pod corev1.Pod
	err := r.getPod(ctx, types.NamespacedName{Namespace: cp.Namespace, Name: cp.Spec.PodName}, &pod)
	if apierrors.IsNotFound(err) {
		return nil, "", "", refuse(cryov1.ReasonPodNotFound, "pod %s not found in namespace %s", cp.Spec.PodName, cp.Namespace)
	}
	if err != nil {
		return nil, "", "", err
	}
	if cp.Status.PodUID != "" && string(pod.UID) != cp.Status.PodUID {
		return nil, "", "", refuse(cryov1.ReasonPodNotFound, "pod %s (UID %s) is gone; a pod of that name with UID %s replaced it", pod.Name, cp.Status.PodUID, pod.UID)
	}
	if !isCryoPod(&pod, r.RuntimeClasses) {
		rc := "none"
		if pod.Spec.RuntimeClassName != nil {
			rc = *pod.Spec.RuntimeClassName
		}
		return nil, "", "", refuse(cryov1.ReasonNotCryoPod, "pod %s runs under RuntimeClass %s, not a cryo one (%s)", pod.Name, rc, strings.Join(r.RuntimeClasses, ", "))
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName == "" || !pod.DeletionTimestamp.IsZero() {
		return nil, "", "", refuse(cryov1.ReasonPodNotRunning, "pod %s is %s, not Running", pod.Name, podState(&pod))
	}
	container := cp.Spec.ContainerName
	if container == "" {
		container = pod.Spec.Containers[0].Name
	} else if !hasContainer(&pod, container) {
		return nil, "", "", refuse(cryov1.ReasonInvalidSpec, "spec.containerName %q: pod %s has no such container", container, pod.Name)
	}
	target, repo, _, err := podTarget(&pod)
	if err != nil {
		return nil, "", "", refuse(cryov1.ReasonNoCheckpointTarget, "%v", err)
	}
	if !inNamespaceStore(r.StoreBase, cp.Namespace, repo) {
		return nil, "", "", refuse(cryov1.ReasonStoreNotAllowed, "the pod's %s %s is outside namespace %s's store %s: the controller reads and tags only there", AnnotationCheckpointTo, repo, cp.Namespace, namespaceStore(r.StoreBase, cp.Namespace))
	}
	if s := strings.TrimSuffix(cp.Spec.Store, "/"); s != "" && s != repo {
		return nil, "", "", refuse(cryov1.ReasonStoreNotAllowed, "spec.store %s is not the pod's checkpoint store %s (its %s, fixed when the pod was created)", s, repo, AnnotationCheckpointTo)
	}
	return &pod, container, target, nil
}

func podState(pod *corev1.Pod) string {
	if !pod.DeletionTimestamp.IsZero() {
		return "terminating"
	}
	if pod.Status.Phase == "" {
		return "Pending"
	}
	return string(pod.Status.Phase)
}

func hasContainer(pod *corev1.Pod, name string) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// create continues a Checkpoint in Creating: the snapshot may already be
// in the store (the kubelet answered, or answered a predecessor of this
// process), a call may still run on the node, or the kubelet is asked
// (again).
func (r *Reconciler) create(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	r.mu.Lock()
	r.owner[cp.Namespace+"/"+cp.Spec.PodName] = owner{cp.UID, cp.Name}
	a, askedHere := r.asked[cp.UID]
	var calling, answered bool
	var answer error
	var retryAt time.Time
	if askedHere {
		calling, answered, answer, retryAt = a.calling, a.answered, a.answer, a.retryAt
	}
	r.mu.Unlock()
	if cp.Status.Snapshot != "" {
		return r.finish(ctx, cp)
	}
	switch {
	case calling:
		// The answer wakes this Checkpoint; the poll is in case it
		// could not.
		return reconcile.Result{RequeueAfter: pollInterval}, nil
	case answered:
		res, err := r.answered(ctx, cp, a, answer)
		if err == nil {
			// Taken only once acted on: a status write that failed
			// (the cache's copy behind the one ask wrote) must not
			// turn into asking again.
			r.mu.Lock()
			a.answered, a.answer = false, nil
			r.mu.Unlock()
		}
		return res, err
	case r.Now().Before(retryAt):
		return reconcile.Result{RequeueAfter: retryAt.Sub(r.Now())}, nil
	}
	pod, container, target, err := r.checkPod(ctx, cp)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			// The pod may be gone because the snapshot was made and a
			// keepRunning=false step, or the user, deleted it: look first.
			if res, ok, lerr := r.adopt(ctx, cp); ok || lerr != nil {
				return res, lerr
			}
		}
		return r.failOrRetry(ctx, cp, err)
	}
	if res, ok, err := r.adopt(ctx, cp); ok || err != nil {
		return res, err
	}
	if res, done := r.pastDeadline(ctx, cp); done {
		return res, nil
	}
	if !askedHere && cp.Status.RequestTime != nil {
		// A previous process asked; its call may still be running on
		// the node: wait it out rather than snapshot twice. The call
		// takes one of the node's slots while a slot is free: this
		// process's bound counts it as far as it can.
		end := cp.Status.RequestTime.Add(time.Duration(cp.Status.RequestTimeoutSeconds)*time.Second + callGrace)
		if now := r.Now(); now.Before(end) {
			r.slots.acquire(pod.Spec.NodeName, client.ObjectKeyFromObject(cp), cp.UID)
			return reconcile.Result{RequeueAfter: min(pollInterval, end.Sub(now))}, nil
		}
	}
	if res, wait := r.waitForSlot(ctx, cp, pod); wait {
		return res, nil
	}
	return r.ask(ctx, cp, pod, container, target)
}

// adopt looks for the Checkpoint's snapshot under the target it asked for
// and records it when it is there (ok).
func (r *Reconciler) adopt(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, bool, error) {
	target := cp.Status.Target
	if target == "" {
		return reconcile.Result{}, false, nil
	}
	f, err := r.find(ctx, cp, target, cp.Status.PodUID)
	if errors.Is(err, errNotOurs) {
		return reconcile.Result{}, false, nil
	}
	if err != nil {
		res, ferr := r.failOrRetry(ctx, cp, err)
		return res, true, ferr
	}
	res, err := r.record(ctx, cp, target, f)
	return res, true, err
}

// waitForSlot takes a slot on the pod's node for cp's call, or says that
// cp waits for one (its message) and when to look again.
func (r *Reconciler) waitForSlot(ctx context.Context, cp *cryov1.Checkpoint, pod *corev1.Pod) (reconcile.Result, bool) {
	ok, why := r.slots.acquire(pod.Spec.NodeName, client.ObjectKeyFromObject(cp), cp.UID)
	if ok {
		return reconcile.Result{}, false
	}
	r.setMessage(ctx, cp, why)
	return reconcile.Result{RequeueAfter: pollInterval}, true
}

// ask starts the kubelet's call (call), whose answer the next reconcile
// takes (answered). The call runs outside the reconcile: it lasts as long
// as the checkpoint on the node (up to maxCallTimeout), and a worker it
// held would be one of the few that every Checkpoint of the cluster, its
// deletion and its expiry wait for.
func (r *Reconciler) ask(ctx context.Context, cp *cryov1.Checkpoint, pod *corev1.Pod, container, target string) (reconcile.Result, error) {
	timeout := min(cp.Status.StartTime.Add(r.Deadline).Sub(r.Now()), maxCallTimeout)
	if timeout < time.Second {
		timeout = time.Second
	}
	now := r.now()
	cp.Status.RequestTime = &now
	cp.Status.RequestTimeoutSeconds = int64((timeout + time.Second - 1) / time.Second)
	if strings.HasPrefix(cp.Status.Message, waitingSlot) {
		cp.Status.Message = ""
	}
	setCondition(cp, cryov1.ConditionProgressing, metav1.ConditionTrue, "KubeletRequested",
		fmt.Sprintf("asked the kubelet on %s to checkpoint container %s", pod.Spec.NodeName, container))
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		return reconcile.Result{}, err
	}
	r.mu.Lock()
	a := r.asked[cp.UID]
	if a == nil {
		a = &attempts{}
		r.asked[cp.UID] = a
	}
	a.calling = true
	r.mu.Unlock()
	r.slots.calling(cp.UID)
	log.FromContext(ctx).Info("asking the kubelet to checkpoint", "node", pod.Spec.NodeName, "pod", pod.Name, "container", container, "timeout", timeout)
	go r.call(ctx, client.ObjectKeyFromObject(cp), cp.UID, a, pod, container, timeout)
	return reconcile.Result{RequeueAfter: pollInterval}, nil
}

// call asks the kubelet, keeps its answer in a and wakes the Checkpoint.
// ctx is the reconcile's, which lives as long as the controller: a
// stopped controller cuts the call, and its successor waits out what the
// node may still do (create).
func (r *Reconciler) call(ctx context.Context, key client.ObjectKey, uid types.UID, a *attempts, pod *corev1.Pod, container string, timeout time.Duration) {
	err := r.Kubelet.Checkpoint(ctx, pod.Spec.NodeName, pod.Namespace, pod.Name, container, timeout)
	next, waits := r.slots.done(uid)
	r.mu.Lock()
	a.calling, a.answered, a.answer = false, true, err
	r.mu.Unlock()
	r.wakeUp(key)
	if waits {
		r.wakeUp(next)
	}
}

// wakeUp enqueues a Checkpoint now rather than at its next poll.
func (r *Reconciler) wakeUp(key client.ObjectKey) {
	cp := &cryov1.Checkpoint{}
	cp.Namespace, cp.Name = key.Namespace, key.Name
	select {
	case r.wake <- event.GenericEvent{Object: cp}:
	default: // the controller stopped, or is far behind: the poll finds it
	}
}

// answered takes the kubelet's answer: on its 200 it looks up and records
// the snapshot.
func (r *Reconciler) answered(ctx context.Context, cp *cryov1.Checkpoint, a *attempts, err error) (reconcile.Result, error) {
	if err != nil {
		// The shim may have published before the answer failed (the
		// kubelet's archive, the proxy's connection): a snapshot that is
		// there is this checkpoint's, and asking again would make another.
		if res, ok, aerr := r.adopt(ctx, cp); ok || aerr != nil {
			return res, aerr
		}
		return r.kubeletFailed(ctx, cp, a, err)
	}
	target := cp.Status.Target
	f, err := r.find(ctx, cp, target, cp.Status.PodUID)
	if errors.Is(err, errNotOurs) {
		return r.fail(ctx, cp, refuse(cryov1.ReasonSnapshotNotFound, "the kubelet answered, but %v", err))
	}
	if err != nil {
		return r.failOrRetry(ctx, cp, err)
	}
	return r.record(ctx, cp, target, f)
}

// kubeletFailed retries a transient failure with backoff, a few of the
// runtime's failures, and fails on the rest.
func (r *Reconciler) kubeletFailed(ctx context.Context, cp *cryov1.Checkpoint, a *attempts, err error) (reconcile.Result, error) {
	var kerr *KubeletError
	transient := !errors.As(err, &kerr) || kerr.Transient()
	r.mu.Lock()
	n := 0
	switch {
	case transient:
		a.transient++
		n = a.transient
	case kerr.StatusCode == 500 && a.internal+1 < internalRetries:
		a.internal++
		n = a.internal
		transient = true
	}
	r.mu.Unlock()
	if !transient {
		return r.fail(ctx, cp, refuse(cryov1.ReasonKubeletFailed, "%v", err))
	}
	// Not past the deadline unnoticed: a call that ended after it (its
	// timeout runs to the deadline) fails the Checkpoint at once.
	left := cp.Status.StartTime.Add(r.Deadline).Sub(r.Now())
	delay := min(r.RetryBase<<min(n-1, 5), time.Minute, max(left, 0)+100*time.Millisecond)
	r.mu.Lock()
	a.retryAt = r.Now().Add(delay)
	r.mu.Unlock()
	r.event(cp, corev1.EventTypeWarning, cryov1.ReasonKubeletFailed, "Checkpoint", "attempt %d failed, retrying in %s: %v", n, delay, err)
	r.setMessage(ctx, cp, fmt.Sprintf("retrying in %s: %v", delay, err))
	return reconcile.Result{RequeueAfter: delay}, nil
}

// find looks the Checkpoint's snapshot up under target.
func (r *Reconciler) find(ctx context.Context, cp *cryov1.Checkpoint, target, podUID string) (found, error) {
	store, tag, err := r.Open(ctx, target)
	if err != nil {
		return found{}, storeErr(err, "open %s", target)
	}
	f, err := lookup(ctx, store, tag, want{
		namespace: cp.Namespace,
		podUID:    podUID,
		notBefore: cp.Status.StartTime.Add(-r.ClockSkew),
		prior:     cp.Status.PriorDigest,
	})
	if err != nil && !errors.Is(err, errNotOurs) {
		return found{}, storeErr(err, "read %s", target)
	}
	return f, err
}

// record tags the snapshot cp-<uid> and writes it into the status.
func (r *Reconciler) record(ctx context.Context, cp *cryov1.Checkpoint, target string, f found) (reconcile.Result, error) {
	repo, _, err := splitTarget(target)
	if err != nil {
		return r.fail(ctx, cp, refuse(cryov1.ReasonNoCheckpointTarget, "%v", err))
	}
	store, _, err := r.Open(ctx, target)
	if err != nil {
		return r.failOrRetry(ctx, cp, storeErr(err, "open %s", target))
	}
	if err := store.Tag(ctx, f.desc, checkpointTag(cp)); err != nil {
		return r.failOrRetry(ctx, cp, storeErr(err, "tag %s:%s", repo, checkpointTag(cp)))
	}
	cp.Status.Snapshot = repo + "@" + f.desc.Digest.String()
	cp.Status.StoredBytes = f.storedBytes
	cp.Status.UploadedBytes = f.uploadedBytes
	cp.Status.PauseWindow = f.pauseWindow
	setCondition(cp, cryov1.ConditionArchived, metav1.ConditionTrue, "UploadComplete",
		fmt.Sprintf("snapshot %s tagged %s", cp.Status.Snapshot, checkpointTag(cp)))
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		return reconcile.Result{}, err
	}
	r.event(cp, corev1.EventTypeNormal, "Archived", "Checkpoint", "snapshot %s (%d bytes stored)", cp.Status.Snapshot, f.storedBytes)
	return r.finish(ctx, cp)
}

// hibernateGrace is the grace period of a hibernated pod's deletion. The
// snapshot is the pod's state from then on: what it does after the pause
// is lost at resume, so a long goodbye (SIGTERM handlers, preStop hooks)
// would only act on a world the resumed pod does not know of. One second,
// not zero: zero force-deletes the object before the kubelet stops the VM.
const hibernateGrace = 1

// finish deletes the pod when it is not kept running, then marks the
// Checkpoint Succeeded.
func (r *Reconciler) finish(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	if !keepRunning(cp.Spec) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: cp.Spec.PodName}}
		uid := types.UID(cp.Status.PodUID)
		err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &uid}, client.GracePeriodSeconds(hibernateGrace))
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return reconcile.Result{}, fmt.Errorf("delete pod %s: %w", cp.Spec.PodName, err)
		}
		r.event(cp, corev1.EventTypeNormal, "PodDeleted", "Checkpoint", "pod %s deleted (keepRunning false)", cp.Spec.PodName)
	}
	now := r.now()
	cp.Status.Phase = cryov1.PhaseSucceeded
	cp.Status.CompletionTime = &now
	cp.Status.Reason, cp.Status.Message = "", ""
	setCondition(cp, cryov1.ConditionProgressing, metav1.ConditionFalse, "Completed", "checkpoint complete")
	setCondition(cp, cryov1.ConditionReady, metav1.ConditionTrue, "CheckpointComplete", "restore with annotation "+AnnotationRestoreCheckpoint+": "+cp.Name)
	r.setExpiry(cp)
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		return reconcile.Result{}, err
	}
	r.release(cp)
	r.event(cp, corev1.EventTypeNormal, "Succeeded", "Checkpoint", "snapshot %s", cp.Status.Snapshot)
	return r.expire(ctx, cp)
}
