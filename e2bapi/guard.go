package e2bapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	user, err := whoAmI(ctx, c)
	if err != nil {
		return "", err
	}
	return user, checkGuardFor(ctx, c, user)
}

// readError is a guard that could not be read (the API server unreachable,
// a timeout): unlike a guard found missing or wrong, it says nothing of
// the guard itself.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// unread: err is only a failed read, one that may pass. A read the API
// server forbids is an answer: the controller's RBAC no longer lets it
// check the guard.
func unread(err error) bool {
	var re *readError
	return errors.As(err, &re) && !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err)
}

func whoAmI(ctx context.Context, c client.Client) (string, error) {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return "", &readError{fmt.Errorf("ask the API server who the controller is (SelfSubjectReview): %w", err)}
	}
	user := review.Status.UserInfo.Username
	if user == "" {
		return "", fmt.Errorf("SelfSubjectReview: the API server named no user")
	}
	return user, nil
}

// checkGuardFor checks that LabelGuard is in force for user.
func checkGuardFor(ctx context.Context, c client.Client, user string) error {
	apply := "apply packaging/kubernetes/controller/e2b-labels.yaml (docs/e2b.md#the-label-guard)"
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: LabelGuard}, &pol); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("ValidatingAdmissionPolicy %s not found: without it any tenant can label a pod with another's sandbox id; %s", LabelGuard, apply)
		}
		return &readError{fmt.Errorf("read ValidatingAdmissionPolicy %s: %w%s", LabelGuard, err, rbacHint(err))}
	}
	if fp := pol.Spec.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail {
		return fmt.Errorf("ValidatingAdmissionPolicy %s: failurePolicy %s, want Fail; %s", LabelGuard, *fp, apply)
	}
	named := ""
	for _, v := range pol.Spec.Variables {
		if v.Name == guardIdentityVariable {
			named, _ = celString(v.Expression)
		}
	}
	if named != user {
		return fmt.Errorf("ValidatingAdmissionPolicy %s: variable %s is %q, but the controller runs as %q: set it to %q (docs/e2b.md#the-label-guard)",
			LabelGuard, guardIdentityVariable, named, user, "'"+user+"'")
	}
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := c.Get(ctx, client.ObjectKey{Name: LabelGuard}, &b); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("ValidatingAdmissionPolicyBinding %s not found: the policy is not in force; %s", LabelGuard, apply)
		}
		return &readError{fmt.Errorf("read ValidatingAdmissionPolicyBinding %s: %w%s", LabelGuard, err, rbacHint(err))}
	}
	if b.Spec.PolicyName != LabelGuard || !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s: policy %q, actions %v; want policy %s with action Deny; %s",
			LabelGuard, b.Spec.PolicyName, b.Spec.ValidationActions, LabelGuard, apply)
	}
	if narrows(b.Spec.MatchResources) {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s: its matchResources leave part of the cluster unguarded; want none; %s", LabelGuard, apply)
	}
	return nil
}

func rbacHint(err error) string {
	if apierrors.IsForbidden(err) {
		return "; the controller's ClusterRole gets it by name (packaging/kubernetes/controller/rbac.yaml)"
	}
	return ""
}

// narrows: a binding with m applies its policy to fewer objects than the
// policy matches (a namespace or object selector, or rules of its own).
func narrows(m *admissionregistrationv1.MatchResources) bool {
	every := func(s *metav1.LabelSelector) bool {
		return s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0)
	}
	return m != nil && (!every(m.NamespaceSelector) || !every(m.ObjectSelector) || len(m.ResourceRules) > 0 || len(m.ExcludeResourceRules) > 0)
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
