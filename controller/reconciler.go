// Package controller is the cluster side of cryo: the Checkpoint
// reconciler, the pod mutating webhook (restore by name, default
// checkpoint target) and the webhook's certificates. It talks to the
// Kubernetes API and to snapshot stores only: the kubelet is reached
// through the API server's node proxy. See docs/controller.md.
package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// Defaults of Reconciler's fields.
const (
	DefaultDeadline = 10 * time.Minute
	// DefaultClockSkew is how much earlier than the request's start a
	// snapshot's creation time may be (the node's clock, truncated to the
	// second, against the controller's).
	DefaultClockSkew = 5 * time.Second
	// maxCallTimeout bounds one kubelet call, and so how long a restarted
	// controller waits for a call its predecessor may have left running.
	maxCallTimeout = 5 * time.Minute
	// callGrace is added to a call's timeout before it is taken as over.
	callGrace = 15 * time.Second
	// internalRetries is how many kubelet 500s (the runtime's checkpoint
	// failed) are tried before the Checkpoint fails.
	internalRetries = 3
	pollInterval    = 3 * time.Second
	waitOtherPod    = 5 * time.Second
)

// Reconciler drives Checkpoints: Pending → Creating → Succeeded | Failed.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Kubelet  Kubelet
	Open     OpenStore
	// RuntimeClasses are the cryo RuntimeClass names.
	RuntimeClasses []string
	// Deadline of a Checkpoint from its start (DefaultDeadline).
	Deadline time.Duration
	// ClockSkew (DefaultClockSkew).
	ClockSkew time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// RetryBase is the first retry delay of a transient failure, doubled
	// up to a minute (2s).
	RetryBase time.Duration

	mu sync.Mutex
	// owner maps a pod (namespace/name) to the Checkpoint creating it.
	owner map[string]owner
	// asked holds the Checkpoints this process called the kubelet for,
	// with the failed attempts: a Checkpoint in Creating that is not here
	// was asked by an earlier process, whose call may still run.
	asked map[types.UID]*attempts

	// skipNameValidation lets tests run one controller after another in a
	// process.
	skipNameValidation bool
}

type attempts struct{ transient, internal int }

type owner struct {
	uid  types.UID
	name string
}

// SetupWithManager registers the reconciler for Checkpoints (and the pods
// they name, so a pod's deletion or phase change is seen).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&cryov1.Checkpoint{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.checkpointsOfPod)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: &r.skipNameValidation}).
		Named("checkpoint").
		Complete(r)
}

// checkpointsOfPod enqueues the unfinished Checkpoints naming a pod.
func (r *Reconciler) checkpointsOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	var list cryov1.CheckpointList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, cp := range list.Items {
		if cp.Spec.PodName == o.GetName() && !finished(&cp) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&cp)})
		}
	}
	return reqs
}

func (r *Reconciler) defaults() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owner == nil {
		r.owner = map[string]owner{}
		r.asked = map[types.UID]*attempts{}
	}
	if r.Deadline <= 0 {
		r.Deadline = DefaultDeadline
	}
	if r.ClockSkew <= 0 {
		r.ClockSkew = DefaultClockSkew
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.RetryBase <= 0 {
		r.RetryBase = 2 * time.Second
	}
}

// Reconcile moves one Checkpoint a step on.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.defaults()
	var cp cryov1.Checkpoint
	if err := r.Client.Get(ctx, req.NamespacedName, &cp); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cp.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &cp)
	}
	if controllerutil.AddFinalizer(&cp, Finalizer) {
		if err := r.Client.Update(ctx, &cp); err != nil {
			return reconcile.Result{}, err
		}
	}
	switch cp.Status.Phase {
	case cryov1.PhaseSucceeded, cryov1.PhaseFailed:
		r.release(&cp)
		return r.expire(ctx, &cp)
	case cryov1.PhaseCreating:
		return r.create(ctx, &cp)
	default:
		return r.start(ctx, &cp)
	}
}

// now is the time as the API stores it (whole seconds), so that a time
// computed from it is the one read back.
func (r *Reconciler) now() metav1.Time { return metav1.NewTime(r.Now().Truncate(time.Second)) }

// refusal is a permanent failure with its reason.
type refusal struct{ reason, message string }

func (e *refusal) Error() string { return e.reason + ": " + e.message }

func refuse(reason, format string, args ...any) *refusal {
	return &refusal{reason: reason, message: fmt.Sprintf(format, args...)}
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
	if res, done := r.pastDeadline(ctx, cp); done {
		return res, nil
	}
	pod, container, target, err := r.checkPod(ctx, cp)
	if err != nil {
		return r.failOrRetry(ctx, cp, err)
	}
	if other, busy := r.claim(ctx, cp, pod); busy {
		r.setMessage(ctx, cp, fmt.Sprintf("waiting for Checkpoint %s of the same pod", other))
		return reconcile.Result{RequeueAfter: waitOtherPod}, nil
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
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: cp.Namespace, Name: cp.Spec.PodName}, &pod)
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

// claim makes cp the one Checkpoint creating its pod's snapshot; busy
// names the other one when there is one. The in-memory owner serializes
// this process's reconciles; the cached list covers Checkpoints a previous
// process left in Creating.
func (r *Reconciler) claim(ctx context.Context, cp *cryov1.Checkpoint, pod *corev1.Pod) (string, bool) {
	key := cp.Namespace + "/" + pod.Name
	r.mu.Lock()
	defer r.mu.Unlock()
	if o, ok := r.owner[key]; ok && o.uid != cp.UID {
		return o.name, true
	}
	var list cryov1.CheckpointList
	if err := r.Client.List(ctx, &list, client.InNamespace(cp.Namespace)); err != nil {
		return "(list failed: " + err.Error() + ")", true
	}
	for _, o := range list.Items {
		if o.UID != cp.UID && o.Spec.PodName == pod.Name && o.Status.Phase == cryov1.PhaseCreating {
			return o.Name, true
		}
	}
	r.owner[key] = owner{cp.UID, cp.Name}
	return "", false
}

// release gives up cp's claim on its pod.
func (r *Reconciler) release(cp *cryov1.Checkpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := cp.Namespace + "/" + cp.Spec.PodName
	if r.owner[key].uid == cp.UID {
		delete(r.owner, key)
	}
	if finished(cp) {
		delete(r.asked, cp.UID)
	}
}

// create continues a Checkpoint in Creating: the snapshot may already be
// in the store (the kubelet answered, or answered a predecessor of this
// process), a call may still run on the node, or the kubelet is asked
// (again).
func (r *Reconciler) create(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	r.mu.Lock()
	r.owner[cp.Namespace+"/"+cp.Spec.PodName] = owner{cp.UID, cp.Name}
	_, askedHere := r.asked[cp.UID]
	r.mu.Unlock()
	if cp.Status.Snapshot != "" {
		return r.finish(ctx, cp)
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
		// the node: wait it out rather than snapshot twice.
		end := cp.Status.RequestTime.Add(time.Duration(cp.Status.RequestTimeoutSeconds)*time.Second + callGrace)
		if now := r.Now(); now.Before(end) {
			return reconcile.Result{RequeueAfter: min(pollInterval, end.Sub(now))}, nil
		}
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

// ask calls the kubelet and, on its 200, looks up and records the snapshot.
func (r *Reconciler) ask(ctx context.Context, cp *cryov1.Checkpoint, pod *corev1.Pod, container, target string) (reconcile.Result, error) {
	timeout := min(cp.Status.StartTime.Add(r.Deadline).Sub(r.Now()), maxCallTimeout)
	if timeout < time.Second {
		timeout = time.Second
	}
	now := r.now()
	cp.Status.RequestTime = &now
	cp.Status.RequestTimeoutSeconds = int64((timeout + time.Second - 1) / time.Second)
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
	r.mu.Unlock()
	log.FromContext(ctx).Info("asking the kubelet to checkpoint", "node", pod.Spec.NodeName, "pod", pod.Name, "container", container, "timeout", timeout)
	err := r.Kubelet.Checkpoint(ctx, pod.Spec.NodeName, pod.Namespace, pod.Name, container, timeout)
	if err != nil {
		return r.kubeletFailed(ctx, cp, a, err)
	}
	f, err := r.find(ctx, cp, target, string(pod.UID))
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
	delay := min(r.RetryBase<<min(n-1, 5), time.Minute)
	if left := cp.Status.StartTime.Add(r.Deadline).Sub(r.Now()); left > 0 {
		// Not past the deadline unnoticed.
		delay = min(delay, left+100*time.Millisecond)
	}
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

// finish deletes the pod when it is not kept running, then marks the
// Checkpoint Succeeded.
func (r *Reconciler) finish(ctx context.Context, cp *cryov1.Checkpoint) (reconcile.Result, error) {
	if !keepRunning(cp.Spec) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: cp.Spec.PodName}}
		uid := types.UID(cp.Status.PodUID)
		err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &uid})
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
// queue's backoff) anything else.
func (r *Reconciler) failOrRetry(ctx context.Context, cp *cryov1.Checkpoint, err error) (reconcile.Result, error) {
	var ref *refusal
	if errors.As(err, &ref) {
		return r.fail(ctx, cp, ref)
	}
	if res, done := r.pastDeadline(ctx, cp); done {
		return res, nil
	}
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
	if !controllerutil.ContainsFinalizer(cp, Finalizer) {
		return reconcile.Result{}, nil
	}
	if repo, _, ok := splitSnapshot(cp.Status.Snapshot); ok {
		store, _, err := r.Open(ctx, repo)
		if err == nil {
			err = store.Untag(ctx, checkpointTag(cp))
		}
		if err != nil && !errdefs.IsNotFound(err) {
			if transientStore(err) {
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

// setMessage records progress in status.message (best effort).
func (r *Reconciler) setMessage(ctx context.Context, cp *cryov1.Checkpoint, msg string) {
	if cp.Status.Message == msg {
		return
	}
	cp.Status.Message = msg
	if err := r.Client.Status().Update(ctx, cp); err != nil {
		log.FromContext(ctx).V(1).Info("status message not saved", "error", err)
	}
}

func (r *Reconciler) event(cp *cryov1.Checkpoint, eventType, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(cp, nil, eventType, reason, action, format, args...)
	}
}

func setCondition(cp *cryov1.Checkpoint, t string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: cp.Generation,
	})
}

func finished(cp *cryov1.Checkpoint) bool {
	return cp.Status.Phase == cryov1.PhaseSucceeded || cp.Status.Phase == cryov1.PhaseFailed
}
