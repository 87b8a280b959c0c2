package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// TestGuardMonitor: the monitor's answer after each check, over a fake
// client whose reads of the binding the test breaks: a guard found missing,
// wrong, narrowed or forbidden to read is refused at once; a read that
// merely fails keeps the last answer for guardUnreadPolls-1 checks; the
// API and the gateway answer 503 naming the guard exactly while Err does.
func TestGuardMonitor(t *testing.T) {
	pol, bind := packagedGuard(t)
	for i, v := range pol.Spec.Variables {
		if v.Name == guardIdentityVariable {
			pol.Spec.Variables[i].Expression = "'" + controllerUser + "'"
		}
	}
	var bindErr atomic.Pointer[error]
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(pol, bind).
		WithIndex(&corev1.Pod{}, IndexSandbox, sandboxOf).WithIndex(&cryov1.Checkpoint{}, IndexSandbox, sandboxOf).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			if r, ok := o.(*authenticationv1.SelfSubjectReview); ok {
				r.Status.UserInfo.Username = controllerUser
				return nil
			}
			return c.Create(ctx, o, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if _, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); ok {
				if err := bindErr.Load(); err != nil {
					return *err
				}
			}
			return c.Get(ctx, key, o, opts...)
		},
	}).Build()
	m := &GuardMonitor{Client: c, Log: testr.New(t)}
	srv := &Server{Client: c, Namespace: "cryo-system", Log: testr.New(t), Guard: m}
	api := httptest.NewServer(srv.Handler())
	t.Cleanup(api.Close)
	gw := httptest.NewServer(&Gateway{Server: srv, Cache: c})
	t.Cleanup(gw.Close)
	ctx := t.Context()
	gr := schema.GroupResource{Group: admissionregistrationv1.GroupName, Resource: "validatingadmissionpolicybindings"}

	// want: the monitor's answer names want ("" for in force), and so do
	// the API's and the gateway's 503s.
	want := func(step, want string) {
		t.Helper()
		err := m.Err()
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Fatalf("%s: Err() = %v, want %q", step, err, want)
		}
		for _, u := range []string{api.URL + "/v2/sandboxes", gw.URL + "/health"} {
			req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
			req.Header.Set("X-API-Key", "no-such-key")
			req.Header.Set(headerSandboxID, "sbx1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			refused := resp.StatusCode == http.StatusServiceUnavailable
			if want == "" && refused || want != "" && (!refused || derr != nil || body.Code != 503 ||
				!strings.Contains(body.Message, "label guard is not in force") || !strings.Contains(body.Message, want)) {
				t.Errorf("%s: %s answers %d %+v, want %s", step, u, resp.StatusCode, body, map[bool]string{true: "a refusal naming " + want, false: "no refusal"}[want != ""])
			}
		}
	}
	check := func() { _ = m.Check(ctx) }
	fail := func(err error) { bindErr.Store(&err) }

	want("before any check", "not checked yet")
	check()
	want("in force", "")

	// The API server unreachable: the last answer holds for two checks.
	fail(apierrors.NewServiceUnavailable("etcd leader changed"))
	check()
	check()
	want("two unread checks", "")
	check()
	want("three unread checks", "not read in 3 checks")
	bindErr.Store(nil)
	check()
	want("read again", "")

	for _, tc := range []struct {
		name string
		err  error
		edit func(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)
		want string
	}{
		{name: "binding deleted", err: apierrors.NewNotFound(gr, LabelGuard), want: "ValidatingAdmissionPolicyBinding " + LabelGuard + " not found"},
		{name: "RBAC removed", err: apierrors.NewForbidden(gr, LabelGuard, errors.New("no get")), want: "forbidden"},
		{name: "warn only", edit: func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			b.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}
		}, want: "with action Deny"},
		{name: "narrowed to some namespaces", edit: func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			b.Spec.MatchResources = &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guarded": "yes"}}}
		}, want: "leave part of the cluster unguarded"},
	} {
		if tc.err != nil {
			fail(tc.err)
		}
		var orig admissionregistrationv1.ValidatingAdmissionPolicyBinding
		if tc.edit != nil {
			if err := c.Get(ctx, client.ObjectKeyFromObject(bind), &orig); err != nil {
				t.Fatal(err)
			}
			edited := orig.DeepCopy()
			tc.edit(edited)
			if err := c.Update(ctx, edited); err != nil {
				t.Fatal(err)
			}
		}
		check()
		want(tc.name, tc.want)
		bindErr.Store(nil)
		if tc.edit != nil {
			var cur admissionregistrationv1.ValidatingAdmissionPolicyBinding
			if err := c.Get(ctx, client.ObjectKeyFromObject(bind), &cur); err != nil {
				t.Fatal(err)
			}
			cur.Spec = orig.Spec
			if err := c.Update(ctx, &cur); err != nil {
				t.Fatal(err)
			}
		}
		check()
		want(tc.name+", then restored", "")
	}

	// Unread right after a refusal: still refused.
	fail(apierrors.NewNotFound(gr, LabelGuard))
	check()
	fail(apierrors.NewServiceUnavailable("etcd leader changed"))
	check()
	want("unread after not found", "not found")
}
