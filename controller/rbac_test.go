package controller

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// packagedClusterRoles reads the ClusterRoles of the packaged rbac.yaml,
// decoded strictly, by name.
func packagedClusterRoles(t *testing.T) map[string]rbacv1.ClusterRole {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "packaging", "kubernetes", "controller", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]rbacv1.ClusterRole{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		if meta.Kind != "ClusterRole" {
			continue
		}
		var r rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		roles[r.Name] = r
	}
	return roles
}

// TestPackagedCheckpointRoles: rbac.yaml aggregates Checkpoints into the
// built-in admin, edit and view ClusterRoles, edit's to create, read and
// delete them, view's to read them, the status read-only to both.
func TestPackagedCheckpointRoles(t *testing.T) {
	roles := packagedClusterRoles(t)
	read := []string{"get", "list", "watch"}
	for name, want := range map[string]struct {
		labels map[string]string
		rules  []rbacv1.PolicyRule
	}{
		"cryo-checkpoints-edit": {
			labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-admin": "true", "rbac.authorization.k8s.io/aggregate-to-edit": "true"},
			rules: []rbacv1.PolicyRule{
				{APIGroups: []string{cryov1.GroupVersion.Group}, Resources: []string{"checkpoints"}, Verbs: []string{"create", "get", "list", "watch", "delete", "deletecollection"}},
				{APIGroups: []string{cryov1.GroupVersion.Group}, Resources: []string{"checkpoints/status"}, Verbs: read},
			},
		},
		"cryo-checkpoints-view": {
			labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-view": "true"},
			rules: []rbacv1.PolicyRule{
				{APIGroups: []string{cryov1.GroupVersion.Group}, Resources: []string{"checkpoints", "checkpoints/status"}, Verbs: read},
			},
		},
	} {
		r, ok := roles[name]
		switch {
		case !ok:
			t.Errorf("rbac.yaml has no ClusterRole %s (ClusterRoles: %v)", name, slices.Sorted(maps.Keys(roles)))
		case !maps.Equal(r.Labels, want.labels):
			t.Errorf("ClusterRole %s: labels %v, want %v", name, r.Labels, want.labels)
		case !reflect.DeepEqual(r.Rules, want.rules):
			t.Errorf("ClusterRole %s: rules %+v, want %+v", name, r.Rules, want.rules)
		case r.AggregationRule != nil:
			t.Errorf("ClusterRole %s aggregates others: %+v", name, r.AggregationRule)
		}
	}
	// No other ClusterRole of the package reaches the built-in ones: the
	// controller's rights stay its own.
	for name, r := range roles {
		if name != "cryo-checkpoints-edit" && name != "cryo-checkpoints-view" {
			for k := range r.Labels {
				if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
					t.Errorf("ClusterRole %s is aggregated (%s)", name, k)
				}
			}
		}
	}
}

// TestCheckpointRolesThroughTheAPIServer installs the packaged roles in a
// real API server beside its built-in admin, edit and view, aggregates
// those as kube-controller-manager's clusterrole-aggregation controller
// does (not run by the test), binds users to them in a namespace and asks
// the API server's authorizer what each may do with Checkpoints.
func TestCheckpointRolesThroughTheAPIServer(t *testing.T) {
	c := apiServer(t)
	ctx := context.Background()
	for _, name := range []string{"cryo-checkpoints-edit", "cryo-checkpoints-view"} {
		r, ok := packagedClusterRoles(t)[name]
		if !ok {
			t.Errorf("rbac.yaml has no ClusterRole %s", name)
			continue
		}
		if err := c.Create(ctx, &r); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), &r) })
	}
	var all rbacv1.ClusterRoleList
	if err := c.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rbac-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	users := map[string]string{"admin": "ann", "edit": "ed", "view": "vi"}
	for builtin, user := range users {
		rules := aggregatedRules(t, all.Items, builtin, 0)
		eff := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns.Name + "-" + builtin}, Rules: rules}
		if err := c.Create(ctx, eff); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), eff) })
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: builtin},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: eff.Name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
		if err := c.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
	allowed := func(user, ns, verb, sub string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: cryov1.GroupVersion.Group, Resource: "checkpoints", Subresource: sub}}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	for _, tc := range []struct {
		verb, sub string
		who       []string // the built-in roles allowed, of admin, edit, view
	}{
		{"create", "", []string{"admin", "edit"}},
		{"get", "", []string{"admin", "edit", "view"}},
		{"list", "", []string{"admin", "edit", "view"}},
		{"watch", "", []string{"admin", "edit", "view"}},
		{"delete", "", []string{"admin", "edit"}},
		{"deletecollection", "", []string{"admin", "edit"}},
		{"update", "", nil},
		{"patch", "", nil},
		{"get", "status", []string{"admin", "edit", "view"}},
		{"update", "status", nil},
		{"patch", "status", nil},
		{"update", "finalizers", nil},
	} {
		for builtin, user := range users {
			if got, want := allowed(user, ns.Name, tc.verb, tc.sub), slices.Contains(tc.who, builtin); got != want {
				t.Errorf("%s (bound to %s) %s checkpoints/%s: allowed %v, want %v", user, builtin, tc.verb, tc.sub, got, want)
			}
			if allowed(user, "default", tc.verb, tc.sub) {
				t.Errorf("%s (bound to %s in %s) may %s checkpoints/%s in namespace default", user, builtin, ns.Name, tc.verb, tc.sub)
			}
		}
	}

	// And as the users: edit creates one (dry run), view may not.
	as := func(user string) client.Client {
		cfg := rest.CopyConfig(envCfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
		uc, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return uc
	}
	cp := func() *cryov1.Checkpoint {
		return &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "turn-1"}, Spec: cryov1.CheckpointSpec{PodName: "agent"}}
	}
	if err := as(users["edit"]).Create(ctx, cp(), client.DryRunAll); err != nil {
		t.Errorf("edit creates a Checkpoint: %v", err)
	}
	if err := as(users["view"]).Create(ctx, cp(), client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("view creates a Checkpoint: %v, want Forbidden", err)
	}
	var list cryov1.CheckpointList
	if err := as(users["view"]).List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
		t.Errorf("view lists Checkpoints: %v", err)
	}
}

// aggregatedRules is the rules of ClusterRole name as the
// clusterrole-aggregation controller fills them: for a role with an
// aggregationRule, those of every ClusterRole its selectors match
// (themselves aggregated: edit's include view's).
func aggregatedRules(t *testing.T, all []rbacv1.ClusterRole, name string, depth int) []rbacv1.PolicyRule {
	t.Helper()
	if depth > 5 {
		t.Fatalf("ClusterRole %s: aggregation too deep", name)
	}
	i := slices.IndexFunc(all, func(r rbacv1.ClusterRole) bool { return r.Name == name })
	if i < 0 {
		t.Fatalf("no ClusterRole %s", name)
	}
	r := all[i]
	if r.AggregationRule == nil {
		return r.Rules
	}
	var rules []rbacv1.PolicyRule
	for _, sel := range r.AggregationRule.ClusterRoleSelectors {
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range all {
			if o.Name != name && s.Matches(labels.Set(o.Labels)) {
				rules = append(rules, aggregatedRules(t, all, o.Name, depth+1)...)
			}
		}
	}
	return rules
}
