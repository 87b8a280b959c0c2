// Package controller is the cluster side of cryo: the Checkpoint
// reconciler, the pod mutating webhook (restore by name, default
// checkpoint target) and the webhook's certificates. It talks to the
// Kubernetes API and to snapshot stores only: the kubelet is reached
// through the API server's node proxy. See docs/controller.md.
package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

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
	// Client reads through the manager's cache, which holds only the pods
	// labelled LabelRuntimeClass (PodCache).
	Client client.Client
	// APIReader reads a pod the cache does not hold (getPod); nil: none.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Kubelet   Kubelet
	Open      OpenStore
	// RuntimeClasses are the cryo RuntimeClass names.
	RuntimeClasses []string
	// StoreBase is the --default-store. A pod's checkpoint target is a
	// pod's own annotation, which its creator may set to any URL; the
	// controller opens, reads and tags it with its own credentials, so it
	// accepts only targets in the namespace's directory, <StoreBase>/<ns>
	// (empty: none).
	StoreBase string
	// Deadline of a Checkpoint from its start (DefaultDeadline).
	Deadline time.Duration
	// ClockSkew (DefaultClockSkew).
	ClockSkew time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// RetryBase is the first retry delay of a transient failure, doubled
	// up to a minute (2s).
	RetryBase time.Duration
	// NodeCalls bounds the kubelet calls in flight on one node
	// (0: DefaultNodeCalls; < 0: unbounded).
	NodeCalls int

	mu sync.Mutex
	// owner maps a pod (namespace/name) to the Checkpoint creating it.
	owner map[string]owner
	// asked holds the Checkpoints this process called the kubelet for,
	// with the failed attempts: a Checkpoint in Creating that is not here
	// was asked by an earlier process, whose call may still run.
	asked map[types.UID]*attempts
	// wake carries the Checkpoints whose kubelet call answered, and
	// those a freed node slot goes to.
	wake chan event.GenericEvent
	// slots bounds the calls on each node (NodeCalls).
	slots *nodeSlots

	// skipNameValidation lets tests run one controller after another in a
	// process.
	skipNameValidation bool
}

// attempts is what this process knows of its kubelet calls for one
// Checkpoint: the failed ones, whether one runs, and the answer of the
// last until a reconcile takes it.
type attempts struct {
	transient, internal int
	calling, answered   bool
	answer              error
	// retryAt is when the last failed attempt's backoff ends: a reconcile
	// before it (the failure's own status write wakes one) waits.
	retryAt time.Time
}

type owner struct {
	uid  types.UID
	name string
}

// SetupWithManager registers the reconciler for Checkpoints (and the pods
// they name, so a pod's deletion or phase change is seen at once). Only
// labelled pods are watched; no step needs a pod's event, since each step
// that waits requeues itself.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.wake = make(chan event.GenericEvent, 1024)
	return ctrl.NewControllerManagedBy(mgr).
		For(&cryov1.Checkpoint{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.checkpointsOfPod)).
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
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
	if r.slots == nil {
		limit := r.NodeCalls
		if limit == 0 {
			limit = DefaultNodeCalls
		}
		// A waiter asks again every pollInterval; one silent for four
		// has gone (deleted, failed) without saying so.
		r.slots = newNodeSlots(limit, r.Now, 4*pollInterval)
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

// release gives up cp's claim on its pod, and its node slot or its place
// in the node's queue unless its call runs.
func (r *Reconciler) release(cp *cryov1.Checkpoint) {
	r.slots.forget(cp.UID)
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
