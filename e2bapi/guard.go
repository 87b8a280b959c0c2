package e2bapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	manifests "github.com/cryo-runtime/cryo/packaging/kubernetes/controller"
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
	if d := guardDiff(&pol.Spec, &shippedGuard.Spec); d != "" {
		return fmt.Errorf("ValidatingAdmissionPolicy %s: spec.%s is not as packaged, so the policy may let a tenant set or remove the labels; %s", LabelGuard, d, apply)
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

// shippedGuard is the label guard's policy as shipped (e2b-labels.yaml,
// its first document).
var shippedGuard = func() *admissionregistrationv1.ValidatingAdmissionPolicy {
	doc, _, _ := bytes.Cut(manifests.E2BLabels, []byte("\n---\n"))
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict(doc, &pol); err != nil || pol.Name != LabelGuard {
		panic(fmt.Sprintf("the packaged e2b-labels.yaml does not start with policy %s: %v", LabelGuard, err))
	}
	return &pol
}()

// guardDiff names what of policy spec got decides differently from want,
// "" when nothing does: its validations, its variables but the controller's
// identity (checked on its own: a deployment under another ServiceAccount
// changes it), what it matches (the API server's defaults aside), its match
// conditions and its parameters. Its failure policy is checked on its own,
// and its audit annotations decide nothing.
func guardDiff(got, want *admissionregistrationv1.ValidatingAdmissionPolicySpec) string {
	switch {
	case !slices.EqualFunc(got.Validations, want.Validations, sameValidation):
		return "validations"
	case !maps.Equal(guardVariables(got), guardVariables(want)):
		return "variables"
	case !equality.Semantic.DeepEqual(matched(got.MatchConstraints), matched(want.MatchConstraints)):
		return "matchConstraints"
	case !equality.Semantic.DeepEqual(got.MatchConditions, want.MatchConditions):
		return "matchConditions"
	case !equality.Semantic.DeepEqual(got.ParamKind, want.ParamKind):
		return "paramKind"
	}
	return ""
}

func sameValidation(a, b admissionregistrationv1.Validation) bool {
	trim := strings.TrimSpace
	return trim(a.Expression) == trim(b.Expression) && trim(a.MessageExpression) == trim(b.MessageExpression) &&
		a.Message == b.Message && equality.Semantic.DeepEqual(a.Reason, b.Reason)
}

func guardVariables(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) map[string]string {
	vars := map[string]string{}
	for _, v := range s.Variables {
		if v.Name != guardIdentityVariable {
			vars[v.Name] = strings.TrimSpace(v.Expression)
		}
	}
	return vars
}

// matched is m with the API server's defaults filled in (every namespace
// and object, the Equivalent match policy, rules of any scope), so that
// the policy as stored compares with the policy as written.
func matched(m *admissionregistrationv1.MatchResources) admissionregistrationv1.MatchResources {
	var out admissionregistrationv1.MatchResources
	if m != nil {
		out = *m.DeepCopy()
	}
	every := &metav1.LabelSelector{}
	for _, s := range []**metav1.LabelSelector{&out.NamespaceSelector, &out.ObjectSelector} {
		if *s == nil || (len((*s).MatchLabels) == 0 && len((*s).MatchExpressions) == 0) {
			*s = every
		}
	}
	if out.MatchPolicy == nil {
		out.MatchPolicy = ptr(admissionregistrationv1.Equivalent)
	}
	for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{out.ResourceRules, out.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				rules[i].Scope = ptr(admissionregistrationv1.AllScopes)
			}
		}
	}
	return out
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
