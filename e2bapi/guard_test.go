package e2bapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var packaging = filepath.Join("..", "packaging", "kubernetes", "controller")

// packagedGuard reads the label guard as shipped.
func packagedGuard(t *testing.T) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	docs := yamlDocs(t, filepath.Join(packaging, "e2b-labels.yaml"))
	if len(docs) != 2 {
		t.Fatalf("e2b-labels.yaml: %d documents, want the policy and its binding", len(docs))
	}
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &pol); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &b); err != nil {
		t.Fatal(err)
	}
	return &pol, &b
}

func yamlDocs(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, d := range strings.Split(string(raw), "\n---\n") {
		if strings.Contains(d, "kind:") {
			docs = append(docs, d)
		}
	}
	return docs
}

// TestPackagedGuard: the shipped policy reserves every label of
// ReservedLabels, names the packaged ServiceAccount as the controller, and
// is bound to deny.
func TestPackagedGuard(t *testing.T) {
	pol, b := packagedGuard(t)
	if pol.Name != LabelGuard || b.Name != LabelGuard || b.Spec.PolicyName != LabelGuard {
		t.Errorf("names: policy %q, binding %q of policy %q, want %s", pol.Name, b.Name, b.Spec.PolicyName, LabelGuard)
	}
	vars := map[string]string{}
	for _, v := range pol.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	for _, l := range ReservedLabels {
		if !strings.Contains(vars["set"], "'"+l+"'") {
			t.Errorf("variable set %q does not reserve %s", vars["set"], l)
		}
	}
	var sa corev1.ServiceAccount
	if err := yaml.Unmarshal([]byte(yamlDocs(t, filepath.Join(packaging, "rbac.yaml"))[0]), &sa); err != nil || sa.Kind != "ServiceAccount" {
		t.Fatalf("rbac.yaml's first object: %v %+v", err, sa.TypeMeta)
	}
	want := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	if got, ok := celString(vars[guardIdentityVariable]); !ok || got != want {
		t.Errorf("variable %s = %q, want the literal %q", guardIdentityVariable, vars[guardIdentityVariable], want)
	}
	if pol.Spec.FailurePolicy == nil || *pol.Spec.FailurePolicy != admissionregistrationv1.Fail ||
		len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("failurePolicy %v, actions %v: want Fail and Deny", pol.Spec.FailurePolicy, b.Spec.ValidationActions)
	}
}

func TestCELString(t *testing.T) {
	for expr, want := range map[string]string{
		`'system:serviceaccount:a:b'`: "system:serviceaccount:a:b",
		` "admin" `:                   "admin",
	} {
		if got, ok := celString(expr); !ok || got != want {
			t.Errorf("celString(%q) = %q, %v; want %q", expr, got, ok, want)
		}
	}
	for _, expr := range []string{``, `'`, `'a"`, `'a' + 'b'`, `request.userInfo.username`, `'a\'b'`, `params.user`} {
		if got, ok := celString(expr); ok {
			t.Errorf("celString(%q) = %q, want no literal", expr, got)
		}
	}
}

// TestGuardDiff: the policy as shipped, and as an API server stores it
// (its defaults filled in), is the packaged one whatever the controller's
// identity; every change that decides differently is named.
func TestGuardDiff(t *testing.T) {
	file, _ := packagedGuard(t)
	if d := guardDiff(&file.Spec, &shippedGuard.Spec); d != "" {
		t.Fatalf("e2b-labels.yaml against the embedded policy: %s differ", d)
	}
	stored := file.DeepCopy()
	m := stored.Spec.MatchConstraints
	m.NamespaceSelector, m.ObjectSelector, m.MatchPolicy = &metav1.LabelSelector{}, &metav1.LabelSelector{}, ptr(admissionregistrationv1.Equivalent)
	for i := range m.ResourceRules {
		m.ResourceRules[i].Scope = ptr(admissionregistrationv1.AllScopes)
	}
	for i, v := range stored.Spec.Variables {
		if v.Name == guardIdentityVariable {
			stored.Spec.Variables[i].Expression = "'system:serviceaccount:elsewhere:cryo'"
		}
	}
	if d := guardDiff(&stored.Spec, &shippedGuard.Spec); d != "" {
		t.Errorf("the policy as stored, under another ServiceAccount: %s differ", d)
	}
	for _, c := range []struct {
		name   string
		change func(*admissionregistrationv1.ValidatingAdmissionPolicySpec)
		want   string
	}{
		{"a validation that always passes", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) { s.Validations[1].Expression = "true" }, "validations"},
		{"a validation removed", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) { s.Validations = s.Validations[:1] }, "validations"},
		{"a label no longer reserved", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			for i := range s.Variables {
				if s.Variables[i].Name == "set" {
					s.Variables[i].Expression = strings.Replace(s.Variables[i].Expression, "'cryo.dev/e2b-sandbox', ", "", 1)
				}
			}
		}, "variables"},
		{"status updates unguarded", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			s.MatchConstraints.ResourceRules[0].Resources = []string{"pods"}
		}, "matchConstraints"},
		{"one namespace only", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			s.MatchConstraints.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"guarded": "yes"}}
		}, "matchConstraints"},
		{"the exact version only", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			s.MatchConstraints.MatchPolicy = ptr(admissionregistrationv1.Exact)
		}, "matchConstraints"},
		{"a match condition", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			s.MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}}
		}, "matchConditions"},
		{"parameters", func(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) {
			s.ParamKind = &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"}
		}, "paramKind"},
	} {
		s := stored.Spec.DeepCopy()
		c.change(s)
		if d := guardDiff(s, &shippedGuard.Spec); d != c.want {
			t.Errorf("%s: guardDiff says %q, want %q", c.name, d, c.want)
		}
	}
}
