package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LabelPolicy is the packaged ValidatingAdmissionPolicy, and its binding's
// name, that holds LabelRuntimeClass to the pod's own RuntimeClass
// (packaging/kubernetes/controller/runtime-class-label.yaml).
const LabelPolicy = "cryo-runtime-class-label"

// DefaultLabelPolicyInterval is how often a LabelPolicyCheck looks: the
// policy bounds the controller's memory, not who reads what, so a few
// minutes without it noticed cost little.
const DefaultLabelPolicyInterval = 5 * time.Minute

// LabelPolicyCheck logs, when the controller starts and whenever it changes,
// whether LabelPolicy is in force. Without it a tenant can put any number of
// its pods in the controller's cache by labelling them with a cryo class:
// memory and watch traffic of the controller, which every namespace's
// Checkpoints share. The controller still works without it, and nothing
// else depends on it (the reconciler checks each pod's runtimeClassName),
// so a missing policy is logged, not refused: a cluster admin who left it
// out on purpose keeps a working controller.
//
// It reads the two objects by name (the ClusterRole's get on them), on
// every replica: each has its own cache.
type LabelPolicyCheck struct {
	Reader client.Reader
	// Policy is the policy's and its binding's name (LabelPolicy).
	Policy string
	// Interval between checks (DefaultLabelPolicyInterval).
	Interval time.Duration
	Log      logr.Logger

	mu   sync.Mutex
	last string // the last state logged: "" before the first check
}

// Check looks once, logs a change and returns what is wrong (nil: in force).
func (c *LabelPolicyCheck) Check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := labelPolicyInForce(cctx, c.Reader, c.policy())
	if ctx.Err() != nil {
		return ctx.Err() // the controller stops: no answer, nothing to log
	}
	state := "in force"
	if err != nil {
		state = err.Error()
	}
	c.mu.Lock()
	changed := state != c.last // never "": the first check logs
	c.last = state
	c.mu.Unlock()
	switch {
	case !changed:
	case err == nil:
		c.Log.Info("label policy in force: only pods of a cryo RuntimeClass can enter the controller's pod cache", "policy", c.policy())
	default:
		c.Log.Error(err, "label policy not in force: a tenant can put any of its pods in the controller's pod cache by labelling it "+
			LabelRuntimeClass+" with a cryo class; apply packaging/kubernetes/controller/runtime-class-label.yaml (docs/controller.md#what-the-controller-caches)",
			"policy", c.policy())
	}
	return err
}

// Start checks now and every Interval until ctx ends.
func (c *LabelPolicyCheck) Start(ctx context.Context) error {
	every := c.Interval
	if every <= 0 {
		every = DefaultLabelPolicyInterval
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) { _ = c.Check(ctx) }, every)
	return nil
}

func (c *LabelPolicyCheck) NeedLeaderElection() bool { return false }

func (c *LabelPolicyCheck) policy() string {
	if c.Policy != "" {
		return c.Policy
	}
	return LabelPolicy
}

// labelPolicyInForce is nil when the policy and a binding of it that denies
// are there. It does not compare the policy with the packaged one, as the
// E2B API's guard does: this one guards memory, not another tenant's data.
func labelPolicyInForce(ctx context.Context, r client.Reader, name string) error {
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	if err := r.Get(ctx, types.NamespacedName{Name: name}, &pol); err != nil {
		return labelPolicyReadErr("ValidatingAdmissionPolicy", name, err)
	}
	var bind admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := r.Get(ctx, types.NamespacedName{Name: name}, &bind); err != nil {
		return labelPolicyReadErr("ValidatingAdmissionPolicyBinding", name, err)
	}
	if bind.Spec.PolicyName != name {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s binds policy %q, not %s", name, bind.Spec.PolicyName, name)
	}
	if !slices.Contains(bind.Spec.ValidationActions, admissionregistrationv1.Deny) {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s has validationActions %v: without Deny the policy refuses nothing", name, bind.Spec.ValidationActions)
	}
	return nil
}

func labelPolicyReadErr(kind, name string, err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %s not found", kind, name)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s %s: not checked, the controller may not read it (its ClusterRole, packaging/kubernetes/controller/rbac.yaml): %w", kind, name, err)
	}
	return fmt.Errorf("%s %s: %w", kind, name, err)
}
