package controller

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cryo-runtime/cryo/controller/apitest"
)

// TestRuntimeClassLabelThroughTheAPIServer runs the packaged policy
// cryo-runtime-class-label beside the packaged webhook in a real API
// server, with a tenant's ServiceAccount (impersonated) that may create
// and edit pods and their status in its namespace. Before the policy the
// tenant puts a runc pod in the controller's cache by labelling it (the
// defect); after it, a pod whose label is not its runtimeClassName is
// refused naming the label, however it is written (a Binding too) and by
// whom, while the
// webhook's label on the tenant's own cryo pods passes, a label is removed
// and put back, and a pod labelled before the policy still takes its
// status updates. With the webhook down, only a label the tenant wrote
// wrong is refused.
func TestRuntimeClassLabelThroughTheAPIServer(t *testing.T) {
	admin := apiServer(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "label-"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tenant := tenantClient(t, admin, ns.Name)
	cryo, runc := "cryo", "runc"
	newPod := func(name string, class *string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Labels: labels},
			Spec: corev1.PodSpec{RuntimeClassName: class, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	labelled := func(v string) map[string]string { return map[string]string{LabelRuntimeClass: v} }

	early := newPod("early", &runc, labelled("cryo"))
	if err := tenant.Create(ctx, early); err != nil {
		t.Fatalf("without the policy the tenant cannot label its pod (is the test's RBAC right?): %v", err)
	}
	installLabelPolicy(t, admin, ns.Name)
	stopWebhook := startWebhook(t, admin, ns.Name, &PodMutator{Reader: admin, RuntimeClasses: []string{"cryo"}})

	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), LabelPolicy) || !strings.Contains(err.Error(), "label "+LabelRuntimeClass+":") {
			t.Errorf("%s: %v\nwant Invalid from %s naming the label", what, err, LabelPolicy)
		}
	}
	admitted := func(what string, p *corev1.Pod, err error, want string) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		} else if got, ok := p.Labels[LabelRuntimeClass]; got != want || ok != (want != "") {
			t.Errorf("%s: labels %v, want %s=%q", what, p.Labels, LabelRuntimeClass, want)
		}
	}
	// The API server loads a policy asynchronously: wait until it denies.
	if !apitest.Eventually(30*time.Second, func() bool {
		err := tenant.Create(ctx, newPod("probe", &runc, labelled("cryo")), client.DryRunAll)
		return apierrors.IsInvalid(err) && strings.Contains(err.Error(), LabelPolicy) && strings.Contains(err.Error(), "label "+LabelRuntimeClass+": value")
	}) {
		t.Fatal("the packaged policy does not deny within 30s")
	}

	// The tenant's pods as created: a label must be the pod's own class.
	err := tenant.Create(ctx, newPod("forged", &runc, labelled("cryo")))
	refused("a runc pod labelled cryo", err)
	t.Logf("the refusal: %v", err)
	refused("a pod of no RuntimeClass labelled cryo", tenant.Create(ctx, newPod("classless", nil, labelled("cryo"))))
	refused("a pod of no RuntimeClass labelled with the empty value", tenant.Create(ctx, newPod("empty", nil, labelled(""))))
	refused("the admin's runc pod labelled cryo", admin.Create(ctx, newPod("admins", &runc, labelled("cryo"))))
	// The webhook labels the tenant's own request: its label arrives as
	// the tenant's, and passes.
	fresh := newPod("fresh", &cryo, nil)
	admitted("a cryo pod", fresh, tenant.Create(ctx, fresh), "cryo")
	corrected := newPod("corrected", &cryo, labelled("runc"))
	admitted("a cryo pod labelled runc (the webhook writes the class)", corrected, tenant.Create(ctx, corrected), "cryo")
	// True of a runc pod too: the policy vouches for the value, the
	// controller's cache takes only its own classes (PodCache).
	honest := newPod("honest", &runc, labelled("runc"))
	admitted("a runc pod labelled runc", honest, tenant.Create(ctx, honest), "runc")
	plain := newPod("plain", &runc, nil)
	admitted("a runc pod", plain, tenant.Create(ctx, plain), "")

	// Updates: the value cannot move away from the class, by update,
	// patch or status update.
	moved := fresh.DeepCopy()
	moved.Labels[LabelRuntimeClass] = "runc"
	refused("changing a cryo pod's label to runc", tenant.Update(ctx, moved.DeepCopy()))
	refused("a status update changing the label", tenant.Status().Update(ctx, moved.DeepCopy()))
	refused("merge-patching cryo onto a runc pod", tenant.Patch(ctx, newPod("plain", nil, nil),
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+LabelRuntimeClass+`":"cryo"}}}`))))
	// Removing it is open (the pod leaves the cache; the controller reads
	// it from the API server when a Checkpoint names it), and so is
	// putting the true value back.
	removed := fresh.DeepCopy()
	delete(removed.Labels, LabelRuntimeClass)
	admitted("removing the label", removed, tenant.Update(ctx, removed), "")
	back := newPod("fresh", nil, nil)
	admitted("putting it back", back, tenant.Patch(ctx, back,
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+LabelRuntimeClass+`":"cryo"}}}`))), "cryo")

	// A pod labelled before the policy: the kubelet's status updates pass,
	// its label cannot move to another wrong value.
	if err := admin.Get(ctx, client.ObjectKeyFromObject(early), early); err != nil {
		t.Fatal(err)
	}
	early.Status.Phase = corev1.PodRunning
	if err := admin.Status().Update(ctx, early); err != nil {
		t.Errorf("status update of a pod labelled before the policy: %v", err)
	}
	early.Labels[LabelRuntimeClass] = "cryo-gpu"
	refused("changing the label of a pod labelled before the policy", tenant.Update(ctx, early))

	// A Binding's labels land on its pod: one with the label is refused,
	// by either path (the tenant may bind, as for a scheduler of its own);
	// the scheduler's, without labels, passes.
	bind := func(p *corev1.Pod, labels map[string]string, legacy bool) error {
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: p.Name, Labels: labels},
			Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
		if legacy {
			return tenant.Create(ctx, b)
		}
		return tenant.SubResource("binding").Create(ctx, p, b)
	}
	unbound := newPod("unbound", &runc, nil)
	if err := tenant.Create(ctx, unbound); err != nil {
		t.Fatal(err)
	}
	refused("a Binding labelling a runc pod cryo (pods/binding)", bind(unbound, labelled("cryo"), false))
	refused("a Binding labelling a runc pod cryo (bindings)", bind(unbound, labelled("cryo"), true))
	refused("a Binding labelling a runc pod runc", bind(unbound, labelled("runc"), false))
	if err := bind(unbound, nil, false); err != nil {
		t.Errorf("a Binding without labels, as the scheduler's: %v", err)
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(unbound), unbound); err != nil || unbound.Spec.NodeName != "node-1" || len(unbound.Labels) != 0 {
		t.Errorf("pod after the Bindings: node %q, labels %v, %v", unbound.Spec.NodeName, unbound.Labels, err)
	}

	// The webhook down: a label the tenant writes right passes, a wrong
	// one is left as written and refused.
	stopWebhook()
	right := newPod("right", &cryo, labelled("cryo"))
	admitted("a cryo pod labelled cryo, the webhook down", right, tenant.Create(ctx, right), "cryo")
	bare := newPod("bare", &cryo, nil)
	admitted("a cryo pod, the webhook down", bare, tenant.Create(ctx, bare), "")
	refused("a cryo pod labelled runc, the webhook down", tenant.Create(ctx, newPod("wrong", &cryo, labelled("runc"))))
}

// tenantClient is a client as the ServiceAccount agent of namespace ns,
// which may create and edit pods and their status there, and bind them.
func tenantClient(t *testing.T, admin client.Client, ns string) client.Client {
	t.Helper()
	ctx := context.Background()
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"bindings", "pods/binding"}, Verbs: []string{"create"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "agent"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "agent"}}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(envCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":agent",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installLabelPolicy creates the packaged policy and its binding, the
// binding limited to namespace ns (the package's other tests share the API
// server and make pods it would refuse, as anyone could before it).
func installLabelPolicy(t *testing.T, c client.Client, ns string) {
	t.Helper()
	pol, bind, err := apitest.Policy(filepath.Join("..", "packaging", "kubernetes", "controller", "runtime-class-label.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if pol.Name != LabelPolicy || bind.Spec.PolicyName != LabelPolicy || bind.Spec.MatchResources != nil ||
		len(bind.Spec.ValidationActions) != 1 || bind.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Fatalf("runtime-class-label.yaml: policy %q, binding of %q to %+v with actions %v; want %s bound everywhere with Deny",
			pol.Name, bind.Spec.PolicyName, bind.Spec.MatchResources, bind.Spec.ValidationActions, LabelPolicy)
	}
	pol.Name += "-" + ns
	bind.Name, bind.Spec.PolicyName = pol.Name, pol.Name
	bind.Spec.MatchResources = &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
	for _, o := range []client.Object{&pol, &bind} {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
}

// TestLabelPolicyCheck: against a real API server, the check names what
// keeps the packaged policy from being in force (the policy missing, its
// binding missing, a binding that only audits), logs each once, and logs
// once more when it is in force. The binding here reaches no namespace, so
// that the other tests' pods do not meet the policy.
func TestLabelPolicyCheck(t *testing.T) {
	admin := apiServer(t)
	ctx := context.Background()
	var mu sync.Mutex
	var logged []string
	c := &LabelPolicyCheck{Reader: admin, Policy: LabelPolicy + "-check", Log: funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{})}
	step := func(what, wantErr string) {
		t.Helper()
		mu.Lock()
		before := len(logged)
		mu.Unlock()
		for i := range 2 {
			err := c.Check(ctx)
			if (wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), wantErr)) {
				t.Fatalf("%s, check %d: %v, want %q", what, i+1, err, wantErr)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if n := len(logged) - before; n != 1 {
			t.Fatalf("%s: %d lines logged over two checks, want 1: %q", what, n, logged[before:])
		}
		if want := "not in force"; wantErr == "" {
			if !strings.Contains(logged[before], "label policy in force") {
				t.Errorf("%s: logged %q, want it in force", what, logged[before])
			}
		} else if !strings.Contains(logged[before], want) || !strings.Contains(logged[before], "runtime-class-label.yaml") {
			t.Errorf("%s: logged %q, want %q and the file to apply", what, logged[before], want)
		}
	}

	step("nothing installed", "ValidatingAdmissionPolicy "+c.Policy+" not found")
	pol, bind, err := apitest.Policy(filepath.Join("..", "packaging", "kubernetes", "controller", "runtime-class-label.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pol.Name, bind.Name, bind.Spec.PolicyName = c.Policy, c.Policy, c.Policy
	bind.Spec.MatchResources = &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "no-such-namespace"}}}
	create := func(o client.Object) {
		t.Helper()
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
	}
	create(&pol)
	step("the policy without a binding", "ValidatingAdmissionPolicyBinding "+c.Policy+" not found")
	deny := bind.Spec.ValidationActions
	bind.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Audit}
	create(&bind)
	step("a binding that audits", "without Deny")
	bind.Spec.ValidationActions = deny
	if err := admin.Update(ctx, &bind); err != nil {
		t.Fatal(err)
	}
	step("the packaged policy and binding", "")

	// Start checks on until its context ends, logging no change again.
	c.Interval = 20 * time.Millisecond
	sctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	mu.Lock()
	before := len(logged)
	mu.Unlock()
	if err := c.Start(sctx); err != nil || sctx.Err() == nil {
		t.Fatalf("Start returned %v before its context ended (%v)", err, sctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != before {
		t.Errorf("Start logged %q with nothing changed", logged[before:])
	}
}
