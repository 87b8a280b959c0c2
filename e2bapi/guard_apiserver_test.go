package e2bapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
	"github.com/cryo-runtime/cryo/controller/apitest"
)

const (
	controllerUser = "system:serviceaccount:cryo-system:cryo-controller"
	tenantUser     = "system:serviceaccount:team-b:agent"
)

// TestLabelGuardThroughTheAPIServer runs the label guard as shipped
// (e2b-labels.yaml and rbac.yaml, unchanged) in a real kube-apiserver
// (envtest; KUBEBUILDER_ASSETS, default /var/cache/cryo/tools/bin) with
// three identities, impersonated: the controller's ServiceAccount with
// its packaged ClusterRole, a tenant's ServiceAccount (team-b/agent) that
// may create, edit and bind pods, edit their status and Checkpoints in
// team-b, and the admin. A victim sandbox runs in team-a. Before the guard the tenant
// labels a pod and a Checkpoint of its own with the victim's id (the
// defect); once it is applied, every way of setting the label is refused
// naming it, the controller still makes what the API makes, and the
// gateway, with a real informer cache, routes none of the victim's
// traffic to the tenant's objects made before the guard. Last, the guard
// is deleted and restored under a GuardMonitor (testGuardRechecked).
func TestLabelGuardThroughTheAPIServer(t *testing.T) {
	cfg := startAPIServer(t)
	scheme := testScheme(t)
	admin := newClient(t, cfg, scheme)
	ctx := t.Context()
	for _, o := range []client.Object{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "cryo"}, Handler: "cryo"},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cryo-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "agent"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
			// as for a scheduler of its own
			{APIGroups: []string{""}, Resources: []string{"bindings", "pods/binding"}, Verbs: []string{"create"}},
			{APIGroups: []string{cryov1.GroupVersion.Group}, Resources: []string{"checkpoints"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "agent"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "agent"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "team-b", Name: "agent"}}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	applyPackaged(t, admin, "rbac.yaml")
	ctl := newClient(t, asServiceAccount(cfg, controllerUser), scheme)
	tenant := newClient(t, asServiceAccount(cfg, tenantUser), scheme)
	srv := &Server{Client: ctl, Namespace: "cryo-system", RuntimeClass: "cryo", Log: testr.New(t), PollInterval: 10 * time.Millisecond}
	sandboxPod := func(ns, id string, gen int) *corev1.Pod {
		return srv.pod(ns, id, gen, Template{Image: "busybox:1", Command: []string{"sleep", "inf"}}, nil, map[string]string{annGen: fmt.Sprint(gen)})
	}
	// The kubelet's part: a status update, labels untouched, which the
	// guard lets through whoever sends it.
	run := func(p *corev1.Pod, ip string) {
		t.Helper()
		p.Status.Phase, p.Status.PodIP = corev1.PodRunning, ip
		if err := admin.Status().Update(ctx, p); err != nil {
			t.Fatalf("pod %s/%s running at %s: %v", p.Namespace, p.Name, ip, err)
		}
	}

	const id = "victim1"
	victim := sandboxPod("team-a", id, 0)
	if err := ctl.Create(ctx, victim); err != nil {
		t.Fatal(err)
	}
	run(victim, "127.0.0.2")

	// Before the guard: the tenant takes the id in its own namespace, a
	// pod shaped as the API's (newer generation) and a Checkpoint.
	early := sandboxPod("team-b", id, 7)
	if err := tenant.Create(ctx, early); err != nil {
		t.Fatalf("without the guard the tenant cannot label a pod (is the test's RBAC right?): %v", err)
	}
	run(early, "127.0.0.3")
	earlyCP := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: podName(id, 6),
		Labels: map[string]string{LabelSandbox: id}, Annotations: map[string]string{annGen: "6", annAutoResume: "true"}},
		Spec: cryov1.CheckpointSpec{PodName: podName(id, 6)}}
	if err := tenant.Create(ctx, earlyCP); err != nil {
		t.Fatal(err)
	}

	pol, b := packagedGuard(t)
	for _, o := range []client.Object{pol, b} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// With the guard of cryo.dev/runtime-class, as the kustomization
	// installs them together: the API's pods pass both.
	applyPackaged(t, admin, "runtime-class-label.yaml")
	// The API server loads a policy asynchronously: wait until both deny.
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "probe", Labels: map[string]string{LabelSandbox: "probe"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
	classless := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "probe", Labels: map[string]string{controller.LabelRuntimeClass: "cryo"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
	if !apitest.Eventually(30*time.Second, func() bool {
		err := tenant.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		err2 := tenant.Create(ctx, classless.DeepCopy(), client.DryRunAll)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), LabelGuard) &&
			apierrors.IsInvalid(err2) && strings.Contains(err2.Error(), "cryo-runtime-class-label") && strings.Contains(err2.Error(), "label "+controller.LabelRuntimeClass+": value")
	}) {
		t.Fatal("the packaged policies do not deny within 30s")
	}
	user, err := CheckLabelGuard(ctx, ctl)
	if err != nil || user != controllerUser {
		t.Errorf("CheckLabelGuard as the controller: %q, %v", user, err)
	}
	if user, err := CheckLabelGuard(ctx, tenant); err == nil || !strings.Contains(err.Error(), tenantUser) {
		t.Errorf("CheckLabelGuard as the tenant: %q, %v; want an error naming %s", user, err, tenantUser)
	}
	// The packaged ClusterRole lets the controller read the guard of
	// cryo.dev/runtime-class too, which it checks at start.
	check := &controller.LabelPolicyCheck{Reader: ctl, Log: testr.New(t)}
	if err := check.Check(ctx); err != nil {
		t.Errorf("the controller's LabelPolicyCheck with the packaged policy and RBAC: %v", err)
	}

	t.Run("refused", func(t *testing.T) {
		refused := func(what, label string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "label "+label+": reserved") ||
				!strings.Contains(err.Error(), controllerUser) {
				t.Errorf("%s: %v\nwant Forbidden naming the label %s and who may set it", what, err, label)
			}
		}
		// (a) A new pod with the victim's id.
		refused("tenant creates a pod with the id", LabelSandbox, tenant.Create(ctx, sandboxPod("team-b", id, 8)))
		// (b) Its own existing pod, labelled by update, patch or status.
		web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "web"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
		if err := tenant.Create(ctx, web); err != nil {
			t.Fatalf("a pod without the labels: %v", err)
		}
		labelled := web.DeepCopy()
		labelled.Labels = map[string]string{LabelSandbox: id}
		refused("tenant updates its pod with the label", LabelSandbox, tenant.Update(ctx, labelled.DeepCopy()))
		refused("tenant merge-patches the label onto its pod", LabelSandbox,
			tenant.Patch(ctx, &corev1.Pod{ObjectMeta: web.ObjectMeta}, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+LabelSandbox+`":"`+id+`"}}}`))))
		refused("tenant puts the label in a status update", LabelSandbox, tenant.Status().Update(ctx, labelled.DeepCopy()))
		// A Binding's labels land on its pod.
		binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "web", Labels: map[string]string{LabelSandbox: id}},
			Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
		refused("tenant binds its pod with the label (pods/binding)", LabelSandbox, tenant.SubResource("binding").Create(ctx, web.DeepCopy(), binding.DeepCopy()))
		refused("tenant binds its pod with the label (bindings)", LabelSandbox, tenant.Create(ctx, binding.DeepCopy()))
		var got corev1.Pod
		if err := admin.Get(ctx, client.ObjectKeyFromObject(web), &got); err != nil || len(got.Labels) != 0 {
			t.Errorf("pod web after the refusals: labels %v, %v", got.Labels, err)
		}
		// (c) A Checkpoint with any of the labels.
		for _, l := range ReservedLabels {
			cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "cp-" + strings.ReplaceAll(l, "/", "-"), Labels: map[string]string{l: id}},
				Spec: cryov1.CheckpointSpec{PodName: "web"}}
			refused("tenant creates a Checkpoint labelled "+l, l, tenant.Create(ctx, cp))
		}
		// Its objects from before the guard keep their label; the value
		// cannot move to yet another id.
		moved := early.DeepCopy()
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(early), moved); err != nil {
			t.Fatal(err)
		}
		moved.Labels[LabelSandbox] = "victim2"
		refused("tenant changes the id of its pod", LabelSandbox, tenant.Update(ctx, moved))
		// Only the controller: the admin is refused too.
		refused("admin creates a pod with the id", LabelSandbox, admin.Create(ctx, sandboxPod("team-b", id, 9)))
	})

	t.Run("the controller and the rest", func(t *testing.T) {
		// A sandbox of team-b's, its pause and a snapshot, as the API
		// makes them, with the packaged RBAC.
		own := sandboxPod("team-b", "own1", 0)
		if err := ctl.Create(ctx, own); err != nil {
			t.Fatalf("the controller creates a sandbox pod: %v", err)
		}
		for _, cp := range []*cryov1.Checkpoint{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: own.Name, Labels: map[string]string{LabelSandbox: "own1"}},
				Spec: cryov1.CheckpointSpec{PodName: own.Name, KeepRunning: ptr(false)}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: snapshotPrefix + "own1", Labels: map[string]string{LabelSnapshot: "own1", LabelSnapshotName: "mine"}},
				Spec: cryov1.CheckpointSpec{PodName: own.Name, KeepRunning: ptr(true)}},
		} {
			if err := ctl.Create(ctx, cp); err != nil {
				t.Errorf("the controller creates Checkpoint %s: %v", cp.Name, err)
			}
		}
		sb := &sandbox{id: "own1", ns: "team-b", pod: own}
		if err := srv.setEndAt(ctx, sb, time.Now().Add(time.Hour)); err != nil {
			t.Errorf("the controller patches the sandbox's end time: %v", err)
		}
		// The tenant may still edit its sandbox's pod without touching the
		// labels, but not remove them: that would hide the pod from the
		// reaper (it would outlive its timeout) and the gateway, or the
		// pause from the API. Deleting the pod stays open.
		var p corev1.Pod
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(own), &p); err != nil {
			t.Fatal(err)
		}
		p.Annotations["team-b/note"] = "mine"
		if err := tenant.Update(ctx, &p); err != nil {
			t.Errorf("tenant annotates its sandbox's pod: %v", err)
		}
		dropped := func(what, label string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "label "+label+": cryo's E2B API finds the sandbox by it") ||
				!strings.Contains(err.Error(), controllerUser) {
				t.Errorf("%s: %v\nwant Forbidden naming the label %s and who may remove it", what, err, label)
			}
		}
		for _, l := range []string{LabelSandbox, controller.LabelRuntimeClass} {
			q := p.DeepCopy()
			delete(q.Labels, l)
			dropped("tenant removes "+l+" from its sandbox's pod", l, tenant.Update(ctx, q))
			dropped("tenant patches "+l+" away", l, tenant.Patch(ctx, &corev1.Pod{ObjectMeta: own.ObjectMeta},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+l+`":null}}}`))))
		}
		var cp cryov1.Checkpoint
		if err := tenant.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: own.Name}, &cp); err != nil {
			t.Fatal(err)
		}
		delete(cp.Labels, LabelSandbox)
		dropped("tenant removes the label from its sandbox's pause", LabelSandbox, tenant.Update(ctx, &cp))
		var got corev1.Pod
		if err := admin.Get(ctx, client.ObjectKeyFromObject(own), &got); err != nil || got.Labels[LabelSandbox] != "own1" || got.Labels[controller.LabelRuntimeClass] != "cryo" {
			t.Errorf("the sandbox's pod after the refusals: labels %v, %v", got.Labels, err)
		}
		// A label of the tenant's own on the pod comes and goes.
		for _, patch := range []string{`{"metadata":{"labels":{"team-b/tier":"gold"}}}`, `{"metadata":{"labels":{"team-b/tier":null}}}`} {
			if err := tenant.Patch(ctx, &corev1.Pod{ObjectMeta: own.ObjectMeta}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
				t.Errorf("tenant patches its own label on its sandbox's pod (%s): %v", patch, err)
			}
		}
		if err := tenant.Delete(ctx, &corev1.Pod{ObjectMeta: own.ObjectMeta}); err != nil {
			t.Errorf("tenant deletes its sandbox's pod: %v", err)
		}
	})

	t.Run("gateway", func(t *testing.T) {
		testGatewayNamespaces(t, asServiceAccount(cfg, controllerUser), scheme, srv, admin, victim, early, earlyCP)
	})

	t.Run("re-checked", func(t *testing.T) {
		testGuardRechecked(t, ctl, startCache(t, asServiceAccount(cfg, controllerUser), scheme), admin, b)
	})

	// An admin who loosens the policy in place (a validation that always
	// passes) leaves it there and bound, failing closed: the controller
	// still finds the guard not in force, naming what differs.
	t.Run("loosened", func(t *testing.T) {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := admin.Get(ctx, client.ObjectKey{Name: LabelGuard}, &p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Validations[0].Expression = "true"
		if err := admin.Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckLabelGuard(ctx, ctl); err == nil || !strings.Contains(err.Error(), "spec.validations is not as packaged") {
			t.Errorf("CheckLabelGuard with a validation that always passes: %v", err)
		}
	})
}

// testGuardRechecked runs a GuardMonitor as the controller (its packaged
// RBAC: get by name) in front of an API and a gateway: once an admin
// deletes the binding both answer 503 naming it within the poll interval,
// and serve again within it once the binding is back.
func testGuardRechecked(t *testing.T, ctl client.Client, cached client.Reader, admin client.Client, bind *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	ctx := t.Context()
	const every = 200 * time.Millisecond
	m := &GuardMonitor{Client: ctl, Interval: every, Log: testr.New(t)}
	if err := m.Check(ctx); err != nil {
		t.Fatalf("first check as the controller: %v", err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Start(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	srv := &Server{Client: ctl, Namespace: "cryo-system", RuntimeClass: "cryo", Log: testr.New(t), Guard: m}
	api := httptest.NewServer(srv.Handler())
	t.Cleanup(api.Close)
	gw := httptest.NewServer(&Gateway{Server: srv, Cache: cached})
	t.Cleanup(gw.Close)
	// answers are the API's and the gateway's codes and bodies for a
	// request that, served, each refuses for a reason of its own (an
	// unknown key, an unknown sandbox).
	answers := func() (int, string, int, string) {
		get := func(u string) (int, string) {
			req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
			req.Header.Set("X-API-Key", "no-such-key")
			req.Header.Set(headerSandboxID, "nosuch1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		c1, b1 := get(api.URL + "/v2/sandboxes")
		c2, b2 := get(gw.URL + "/health")
		return c1, b1, c2, b2
	}
	// within waits until both answer as want says, and fails unless they
	// do within the poll interval and a check's time (a second).
	within := func(what string, want func(int, string, int, string) bool) {
		t.Helper()
		start := time.Now()
		var c1, c2 int
		var b1, b2 string
		if !apitest.Eventually(every+time.Second, func() bool { c1, b1, c2, b2 = answers(); return want(c1, b1, c2, b2) }) {
			t.Fatalf("%s: the API answers %d %s, the gateway %d %s", what, c1, b1, c2, b2)
		}
		t.Logf("%s: after %s (poll interval %s)", what, time.Since(start).Round(time.Millisecond), every)
	}
	served := func(c1 int, _ string, c2 int, b2 string) bool {
		return c1 == http.StatusUnauthorized && c2 == http.StatusBadGateway && strings.Contains(b2, "not found")
	}
	if c1, b1, c2, b2 := answers(); !served(c1, b1, c2, b2) {
		t.Fatalf("with the guard: the API answers %d %s, the gateway %d %s", c1, b1, c2, b2)
	}

	var cur admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := admin.Get(ctx, client.ObjectKeyFromObject(bind), &cur); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	want := "ValidatingAdmissionPolicyBinding " + LabelGuard + " not found"
	within("binding deleted", func(c1 int, b1 string, c2 int, b2 string) bool {
		return c1 == http.StatusServiceUnavailable && strings.Contains(b1, want) &&
			c2 == http.StatusServiceUnavailable && strings.Contains(b2, want)
	})
	restored := bind.DeepCopy()
	restored.ResourceVersion, restored.UID = "", ""
	if err := admin.Create(ctx, restored); err != nil {
		t.Fatal(err)
	}
	within("binding restored", served)
}

// testGatewayNamespaces serves the victim's id through a Gateway with a
// real informer cache (the controller's identity): while the tenant's
// objects made before the guard hold the id too, nothing is routed, and
// the tenant's envd sees no request; once they are gone the victim is
// served.
func testGatewayNamespaces(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, srv *Server, admin client.Client, victim, early *corev1.Pod, earlyCP *cryov1.Checkpoint) {
	ctx := t.Context()
	id := victim.Labels[LabelSandbox]
	var victimHits, tenantHits atomic.Int32
	port := envdAt(t, "127.0.0.2", 0, &victimHits)
	envdAt(t, "127.0.0.3", port, &tenantHits)

	gw := &Gateway{Server: srv, Cache: startCache(t, cfg, scheme), Port: port, ReadyWait: 2 * time.Second}
	ts := httptest.NewServer(gw)
	t.Cleanup(ts.Close)
	get := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/health", nil)
		req.Header.Set(headerSandboxID, id)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	expect := func(what string, code int, body string) {
		t.Helper()
		var gotCode int
		var got string
		if !apitest.Eventually(10*time.Second, func() bool { gotCode, got = get(); return gotCode == code && strings.Contains(got, body) }) {
			t.Errorf("%s: %d %s, want %d with %q", what, gotCode, got, code, body)
		}
	}

	expect("the victim running, the tenant's pod of the id running in team-b", 502, "more than one namespace")
	if n := tenantHits.Load(); n != 0 {
		t.Fatalf("the tenant's envd got %d of the victim's requests", n)
	}
	if err := admin.Delete(ctx, early, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	// Still the tenant's Checkpoint in team-b.
	expect("the tenant's Checkpoint left", 502, "more than one namespace")
	if err := admin.Delete(ctx, earlyCP); err != nil {
		t.Fatal(err)
	}
	expect("the foreign objects gone", 200, "victim envd")

	// Paused: the victim's pause Checkpoint, its pod gone; a foreign pod of
	// the id must not be taken for its resumed self. The foreign one is
	// made with the controller's own rights here: the guard stops
	// everyone else (above).
	pause := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: victim.Name, Labels: map[string]string{LabelSandbox: id},
		Annotations: map[string]string{annGen: "0"}}, Spec: cryov1.CheckpointSpec{PodName: victim.Name, KeepRunning: ptr(false)}}
	if err := srv.Client.Create(ctx, pause); err != nil {
		t.Fatal(err)
	}
	pause.Status.Phase = cryov1.PhaseSucceeded
	if err := admin.Status().Update(ctx, pause); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, victim, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	expect("paused", 502, "paused")
	foreign := srv.pod("team-b", id, 1, Template{Image: "busybox:1"}, nil, map[string]string{annGen: "1"})
	if err := srv.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	foreign.Status.Phase, foreign.Status.PodIP = corev1.PodRunning, "127.0.0.3"
	if err := admin.Status().Update(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	expect("paused, a foreign pod of the id running", 502, "more than one namespace")
	if n := tenantHits.Load(); n != 0 {
		t.Errorf("the foreign envd got %d of the victim's requests", n)
	}
}

// startCache runs an informer cache as cfg's user, indexed as the
// gateway's, until the test ends.
func startCache(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme) cache.Cache {
	t.Helper()
	ctx := t.Context()
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := IndexSandboxes(ctx, c); err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Start(cctx) }()
	t.Cleanup(func() { stop(); <-done })
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache not synced")
	}
	return c
}

// envdAt serves a stub envd at ip:port (0: any port) that counts its
// requests and says whose it is; it returns the port.
func envdAt(t *testing.T, ip string, port int, hits *atomic.Int32) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	who := map[string]string{"127.0.0.2": "victim", "127.0.0.3": "tenant"}[ip]
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, who+" envd "+r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// startAPIServer starts a kube-apiserver and etcd (envtest) with the
// packaged CRD; its config is the admin's.
func startAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	env, cfg, err := apitest.Start(filepath.Join(packaging, "crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cfg
}

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := cryov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

func newClient(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// asServiceAccount is cfg impersonating a ServiceAccount's user
// (system:serviceaccount:<ns>:<name>) with the groups its tokens carry.
func asServiceAccount(cfg *rest.Config, user string) *rest.Config {
	c := rest.CopyConfig(cfg)
	ns := strings.Split(user, ":")[2]
	c.Impersonate = rest.ImpersonationConfig{UserName: user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	return c
}

// applyPackaged creates every object of a packaged manifest.
func applyPackaged(t *testing.T, c client.Client, file string) {
	t.Helper()
	for _, d := range yamlDocs(t, filepath.Join(packaging, file)) {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(d), &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(t.Context(), &u); err != nil {
			t.Fatalf("%s: %s %s: %v", file, u.GetKind(), u.GetName(), err)
		}
	}
}
