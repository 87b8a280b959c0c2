package e2bapi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LabelGuard names the ValidatingAdmissionPolicy, and its binding, that
// lets only the controller set ReservedLabels on pods and Checkpoints
// (packaging/kubernetes/controller/e2b-labels.yaml).
const LabelGuard = "cryo-e2b-labels"

// guardIdentityVariable is the policy's variable holding, as a CEL string
// literal, the one user it lets set the labels.
const guardIdentityVariable = "controller"

// ReservedLabels are the labels the API and the gateway read as "the E2B
// API made this object, for this sandbox or snapshot". The gateway routes
// by LabelSandbox across namespaces, so whoever could set it on a pod of
// their own could receive another tenant's traffic; LabelGuard keeps all
// three to the controller.
var ReservedLabels = []string{LabelSandbox, LabelSnapshot, LabelSnapshotName}

// CheckLabelGuard answers who c is (a SelfSubjectReview: the name the API
// server gives its requests, which is what the policy compares) and
// checks that LabelGuard is in force for that name: the policy fails
// closed, its binding denies, and its controller variable names this user.
// A missing or mismatched guard is an error that says what to apply.
func CheckLabelGuard(ctx context.Context, c client.Client) (string, error) {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return "", fmt.Errorf("ask the API server who the controller is (SelfSubjectReview): %w", err)
	}
	user := review.Status.UserInfo.Username
	if user == "" {
		return "", fmt.Errorf("SelfSubjectReview: the API server named no user")
	}
	apply := "apply packaging/kubernetes/controller/e2b-labels.yaml (docs/e2b.md#the-label-guard)"
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: LabelGuard}, &pol); err != nil {
		if apierrors.IsNotFound(err) {
			return user, fmt.Errorf("ValidatingAdmissionPolicy %s not found: without it any tenant can label a pod with another's sandbox id; %s", LabelGuard, apply)
		}
		return user, fmt.Errorf("read ValidatingAdmissionPolicy %s: %w", LabelGuard, err)
	}
	if fp := pol.Spec.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail {
		return user, fmt.Errorf("ValidatingAdmissionPolicy %s: failurePolicy %s, want Fail; %s", LabelGuard, *fp, apply)
	}
	named := ""
	for _, v := range pol.Spec.Variables {
		if v.Name == guardIdentityVariable {
			named, _ = celString(v.Expression)
		}
	}
	if named != user {
		return user, fmt.Errorf("ValidatingAdmissionPolicy %s: variable %s is %q, but the controller runs as %q: set it to %q (docs/e2b.md#the-label-guard)",
			LabelGuard, guardIdentityVariable, named, user, "'"+user+"'")
	}
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := c.Get(ctx, client.ObjectKey{Name: LabelGuard}, &b); err != nil {
		if apierrors.IsNotFound(err) {
			return user, fmt.Errorf("ValidatingAdmissionPolicyBinding %s not found: the policy is not in force; %s", LabelGuard, apply)
		}
		return user, fmt.Errorf("read ValidatingAdmissionPolicyBinding %s: %w", LabelGuard, err)
	}
	if b.Spec.PolicyName != LabelGuard || !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
		return user, fmt.Errorf("ValidatingAdmissionPolicyBinding %s: policy %q, actions %v; want policy %s with action Deny; %s",
			LabelGuard, b.Spec.PolicyName, b.Spec.ValidationActions, LabelGuard, apply)
	}
	return user, nil
}

// celString is the value of a CEL string literal without escapes, 'x' or
// "x"; ok is false for any other expression.
func celString(expr string) (string, bool) {
	e := strings.TrimSpace(expr)
	if len(e) < 2 || (e[0] != '\'' && e[0] != '"') || e[len(e)-1] != e[0] {
		return "", false
	}
	v := e[1 : len(e)-1]
	if strings.ContainsAny(v, `\'"`) {
		return "", false
	}
	return v, true
}
