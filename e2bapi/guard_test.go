package e2bapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
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
