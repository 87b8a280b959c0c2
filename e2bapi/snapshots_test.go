package e2bapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

func (f *fixture) checkpoint(ns, name string) *cryov1.Checkpoint {
	f.t.Helper()
	var cp cryov1.Checkpoint
	if err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &cp); err != nil {
		f.t.Fatal(err)
	}
	return &cp
}

func (f *fixture) snapshots(key, query string) ([]snapshotBody, string) {
	f.t.Helper()
	var out []snapshotBody
	return out, f.page(key, "/snapshots"+query, &out)
}

// page GETs a list and answers its X-Next-Token.
func (f *fixture) page(key, path string, out any) string {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.url+path, nil)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(out) != nil {
		f.t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	return resp.Header.Get("X-Next-Token")
}

// TestSnapshots: createSnapshot is a keepRunning Checkpoint labelled as a
// snapshot (not as a pause) with the token beside it; the sandbox runs
// on; the snapshot lists, pages, serves as a template (by id and by name)
// under a new sandbox id with the source's token, outlives its sandbox,
// and deleteSnapshot removes it.
func TestSnapshots(t *testing.T) {
	f := newFixture(t)
	src := f.createSandbox("key-a", `{"metadata":{"m":"1"},"envVars":{"A":"1"}}`)
	var snap snapshotBody
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{"name":"my-snap"}`, &snap); code != http.StatusCreated ||
		!strings.HasPrefix(snap.SnapshotID, "e2b-snap-") || len(snap.Names) != 1 || snap.Names[0] != "my-snap" {
		t.Fatalf("createSnapshot: %d %+v", code, snap)
	}
	cp := f.checkpoint("team-a", snap.SnapshotID)
	if cp.Spec.PodName != podName(src.SandboxID, 0) || cp.Spec.KeepRunning == nil || !*cp.Spec.KeepRunning ||
		cp.Labels[LabelSnapshot] != src.SandboxID || cp.Labels[LabelSandbox] != "" || cp.Labels[LabelSnapshotName] != "my-snap" {
		t.Errorf("snapshot Checkpoint %+v %+v", cp.ObjectMeta, cp.Spec)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+src.SandboxID, "", &d); code != 200 || d.State != "running" {
		t.Errorf("source after snapshot: %d %+v", code, d)
	}
	var unnamed snapshotBody
	if code := f.do("key-a", "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{}`, &unnamed); code != http.StatusCreated || len(unnamed.Names) != 0 {
		t.Fatalf("unnamed createSnapshot: %d %+v", code, unnamed)
	}

	// Listing: all, by sandbox, by name, one per page.
	if all, next := f.snapshots("key-a", ""); len(all) != 2 || next != "" {
		t.Errorf("list: %+v next %q", all, next)
	}
	if none, _ := f.snapshots("key-a", "?sandboxID=other"); len(none) != 0 {
		t.Errorf("list by another sandbox: %+v", none)
	}
	if byName, _ := f.snapshots("key-a", "?name=my-snap"); len(byName) != 1 || byName[0].SnapshotID != snap.SnapshotID {
		t.Errorf("list by name: %+v", byName)
	}
	p1, next := f.snapshots("key-a", "?limit=1&sandboxID="+src.SandboxID)
	p2, last := f.snapshots("key-a", "?limit=1&nextToken="+next)
	if len(p1) != 1 || next == "" || len(p2) != 1 || last != "" || p1[0].SnapshotID == p2[0].SnapshotID {
		t.Errorf("paging: %+v %q, %+v %q", p1, next, p2, last)
	}
	if other, _ := f.snapshots("key-b", ""); len(other) != 0 {
		t.Errorf("another namespace's key lists %+v", other)
	}

	// Kill the source: the snapshot stays and starts new sandboxes.
	if code := f.do("key-a", "DELETE", "/sandboxes/"+src.SandboxID, "", nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	for _, template := range []string{snap.SnapshotID, "my-snap"} {
		sb := f.createSandbox("key-a", `{"templateID":"`+template+`","metadata":{"m":"2"},"envVars":{"B":"2"}}`)
		if sb.SandboxID == src.SandboxID || *sb.EnvdAccessToken != *src.EnvdAccessToken || sb.TemplateID != template {
			t.Errorf("create from %s: %+v, want a new id with the source's token", template, sb)
		}
		p := f.pod("team-a", podName(sb.SandboxID, 0))
		noShimAnnotations(t, p)
		if p.Annotations[controller.AnnotationRestoreCheckpoint] != snap.SnapshotID || p.Annotations[AnnotationEnvdTokenSHA256] != sha(*src.EnvdAccessToken) {
			t.Errorf("pod from %s: %v", template, p.Annotations)
		}
		if sec, err := f.secret("team-a", "e2b-"+sb.SandboxID); err != nil || string(sec.Data[SecretTokenField]) != *src.EnvdAccessToken {
			t.Errorf("token Secret of the new sandbox: %v", err)
		}
		if in := f.lastInit(); in.EnvVars["A"] != "1" || in.EnvVars["B"] != "2" {
			t.Errorf("/init env %v, want the source's and the request's", in.EnvVars)
		}
		var info listedBody
		if f.do("key-a", "GET", "/sandboxes/"+sb.SandboxID, "", &info); info.Metadata["m"] != "2" || info.TemplateID != snap.SnapshotID {
			t.Errorf("getInfo of the new sandbox: %+v", info)
		}
	}
	var e apiError
	if code := f.do("key-b", "POST", "/v2/sandboxes", `{"templateID":"`+snap.SnapshotID+`"}`, &e); code != http.StatusNotFound {
		t.Errorf("another namespace's key creates from the snapshot: %d %+v", code, e)
	}

	// The controller's finalizer keeps a deleted Checkpoint until the
	// snapshot is untagged: it is gone for the SDK all the same.
	held := f.checkpoint("team-a", snap.SnapshotID)
	held.Finalizers = append(held.Finalizers, "cryo.dev/test")
	if err := f.cl.Update(t.Context(), held); err != nil {
		t.Fatal(err)
	}
	if code := f.do("key-a", "DELETE", "/templates/"+snap.SnapshotID, "", nil); code != http.StatusNoContent {
		t.Errorf("deleteSnapshot: %d", code)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"templateID":"`+snap.SnapshotID+`"}`, nil); code != http.StatusNotFound {
		t.Errorf("create from a snapshot being deleted: %d, want 404", code)
	}
	if _, err := f.secret("team-a", snap.SnapshotID); !apierrors.IsNotFound(err) {
		t.Errorf("snapshot token Secret after delete: %v", err)
	}
	if code := f.do("key-a", "DELETE", "/templates/"+snap.SnapshotID, "", &e); code != http.StatusNotFound {
		t.Errorf("second deleteSnapshot: %d, want 404 (the SDK's false)", code)
	}
	if code := f.do("key-a", "DELETE", "/templates/base", "", &e); code != http.StatusNotFound {
		t.Errorf("delete of a configured template: %d", code)
	}
}

// TestSnapshotRefusals: a paused sandbox, a bad name, a failed
// Checkpoint (removed with its Secret), a Checkpoint not made by the API.
func TestSnapshotRefusals(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/snapshots", `{"name":"team/x:v1"}`, &e); code != http.StatusBadRequest || !strings.HasPrefix(e.Message, "name:") {
		t.Errorf("bad name: %d %+v", code, e)
	}
	if code := f.do("key-b", "POST", "/sandboxes/"+id+"/snapshots", `{}`, &e); code != http.StatusNotFound {
		t.Errorf("another namespace's key: %d", code)
	}
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/snapshots", `{}`, &e); code != http.StatusConflict || !strings.Contains(e.Message, podName(id, 0)) {
		t.Errorf("snapshot of a paused sandbox: %d %+v", code, e)
	}
	// Its pause Checkpoint is a template, with its token.
	sb := f.createSandbox("key-a", `{"templateID":"`+podName(id, 0)+`"}`)
	if p := f.pod("team-a", podName(sb.SandboxID, 0)); p.Annotations[controller.AnnotationRestoreCheckpoint] != podName(id, 0) {
		t.Errorf("create from a pause Checkpoint: %v", p.Annotations)
	}

	foreign := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "by-hand"}, Spec: cryov1.CheckpointSpec{PodName: "web"}}
	if err := f.cl.Create(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	foreign.Status.Phase = cryov1.PhaseSucceeded
	if err := f.cl.Update(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	for _, tpl := range []string{"team/x:v1", "../pods/x", "nope"} {
		if code := f.do("key-a", "POST", "/v2/sandboxes", `{"templateID":"`+tpl+`"}`, &e); code != http.StatusNotFound {
			t.Errorf("create from template %q: %d %+v, want 404", tpl, code, e)
		}
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"templateID":"by-hand"}`, &e); code != http.StatusBadRequest || !strings.Contains(e.Message, "not made through the E2B API") {
		t.Errorf("create from a foreign Checkpoint: %d %+v", code, e)
	}
}

// TestSnapshotFailed: the controller's reason reaches the caller and the
// failed Checkpoint and its Secret are gone.
func TestSnapshotFailed(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	f.srv.Client = failingCheckpoints{f.cl}
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/snapshots", `{}`, &e); code != 500 || !strings.Contains(e.Message, "KubeletFailed: boom") {
		t.Errorf("failed snapshot: %d %+v", code, e)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps); err != nil || len(cps.Items) != 0 {
		t.Errorf("Checkpoints left: %v %d", err, len(cps.Items))
	}
	var secs corev1.SecretList
	if err := f.cl.List(context.Background(), &secs, client.InNamespace("team-a")); err != nil || len(secs.Items) != 1 || secs.Items[0].Name != "e2b-"+id {
		t.Errorf("Secrets after a failed snapshot: %v %+v, want the sandbox's only", err, secs.Items)
	}
}

// failingCheckpoints creates every Checkpoint already Failed, before the
// fixture's controller sees it.
type failingCheckpoints struct{ client.Client }

func (c failingCheckpoints) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	cp, ok := obj.(*cryov1.Checkpoint)
	if !ok {
		return c.Client.Create(ctx, obj, opts...)
	}
	cp.Status = cryov1.CheckpointStatus{Phase: cryov1.PhaseFailed, Reason: cryov1.ReasonKubeletFailed, Message: "boom"}
	return c.Client.Create(ctx, cp, opts...)
}
