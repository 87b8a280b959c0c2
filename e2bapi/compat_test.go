package e2bapi

import (
	"context"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// endAt is the end time getInfo shows for sandbox id.
func (f *fixture) endAt(id string) time.Time {
	f.t.Helper()
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != http.StatusOK {
		f.t.Fatalf("get %s: %d", id, code)
	}
	end, err := time.Parse(time.RFC3339Nano, d.EndAt)
	if err != nil {
		f.t.Fatalf("get %s: endAt %q: %v", id, d.EndAt, err)
	}
	return end
}

// TestV1Routes: the v1 create and connect that E2B's API serves beside
// the v2 ones, which some SDK versions call.
func TestV1Routes(t *testing.T) {
	f := newFixture(t)
	var sb sandboxBody
	if code := f.do("key-a", "POST", "/sandboxes", `{"templateID":"base","timeout":60}`, &sb); code != http.StatusCreated || sb.SandboxID == "" || sb.EnvdAccessToken == nil {
		t.Fatalf("POST /sandboxes: %d %+v, want 201 with a sandbox", code, sb)
	}
	if code := f.do("key-a", "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`, &sb); code != http.StatusOK {
		t.Fatalf("POST /sandboxes/{id}/connect: %d, want 200", code)
	}
	var e apiError
	if code := f.do("key-b", "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{}`, &e); code != http.StatusNotFound {
		t.Errorf("v1 connect with another namespace's key: %d, want 404", code)
	}
}

// TestConnectOnlyExtends: as on E2B, connecting to a running sandbox
// never shortens its lifetime, and a connect without a timeout (what the
// SDK sends unless asked) gives at least the default 300 s.
func TestConnectOnlyExtends(t *testing.T) {
	f := newFixture(t)
	long := f.create("key-a", `{"templateID":"base","timeout":3600}`)
	for _, body := range []string{`{}`, `{"timeout":60}`, ``} {
		if code := f.do("key-a", "POST", "/v2/sandboxes/"+long+"/connect", body, nil); code != http.StatusOK {
			t.Fatalf("connect %q: %d", body, code)
		}
		if got, want := f.endAt(long), f.now.Add(time.Hour); !got.Equal(want) {
			t.Errorf("after connect %q: end %s, want %s (not shortened)", body, got, want)
		}
	}
	short := f.create("key-a", `{"templateID":"base","timeout":10}`)
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+short+"/connect", `{}`, nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if got, want := f.endAt(short), f.now.Add(300*time.Second); !got.Equal(want) {
		t.Errorf("connect without a timeout to a sandbox with 10 s left: end %s, want %s (the default 300 s)", got, want)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+short+"/connect", `{"timeout":7200}`, nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if got, want := f.endAt(short), f.now.Add(2*time.Hour); !got.Equal(want) {
		t.Errorf("connect with 7200 s: end %s, want %s", got, want)
	}
	var e apiError
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+short+"/connect", `{"timeout":172800}`, &e); code != http.StatusBadRequest {
		t.Errorf("connect with 48 h: %d %+v, want 400", code, e)
	}
}

// TestTimeouts: E2B's rules for the numbers. Create and fork refuse 0 and
// more than the longest lifetime; setTimeout clamps instead.
func TestTimeouts(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{"templateID":"base","timeout":60}`)
	for _, c := range []struct{ path, body string }{
		{"/v2/sandboxes", `{"templateID":"base","timeout":0}`},
		{"/v2/sandboxes", `{"templateID":"base","timeout":86401}`},
		{"/sandboxes/" + id + "/fork", `{"timeout":0}`},
	} {
		var e apiError
		if code := f.do("key-a", "POST", c.path, c.body, &e); code != http.StatusBadRequest || e.Message == "" {
			t.Errorf("POST %s %s: %d %+v, want 400 naming the timeout", c.path, c.body, code, e)
		}
	}
	for body, want := range map[string]time.Time{
		`{"timeout":172800}`: f.now.Add(24 * time.Hour),
		`{"timeout":120}`:    f.now.Add(2 * time.Minute),
		`{"timeout":-5}`:     f.now,
	} {
		if code := f.do("key-a", "POST", "/sandboxes/"+id+"/timeout", body, nil); code != http.StatusNoContent {
			t.Fatalf("setTimeout %s: %d, want 204", body, code)
		}
		if got := f.endAt(id); !got.Equal(want) {
			t.Errorf("setTimeout %s: end %s, want %s", body, got, want)
		}
	}
}

// TestPauseWithoutMemoryRefused: pause({keepMemory: false}) asks for a
// filesystem-only snapshot, which cryo does not make: 400, and nothing is
// paused.
func TestPauseWithoutMemoryRefused(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{"memory":false}`, &e); code != http.StatusBadRequest || e.Message == "" {
		t.Fatalf("pause with memory false: %d %+v, want 400", code, e)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(context.Background(), &cps, client.InNamespace("team-a")); err != nil || len(cps.Items) != 0 {
		t.Errorf("Checkpoints after the refused pause: %v %d, want none", err, len(cps.Items))
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != http.StatusOK || d.State != "running" {
		t.Errorf("after the refused pause: %d %+v, want running", code, d)
	}
}

// beginPause creates the pause Checkpoint of sandbox id's first pod, as
// the API's pause does, and leaves it to the test to finish.
func (f *fixture) beginPause(id string) {
	f.t.Helper()
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: podName(id, 0), Labels: map[string]string{LabelSandbox: id},
			Annotations: f.pod("team-a", podName(id, 0)).Annotations},
		Spec: cryov1.CheckpointSpec{PodName: podName(id, 0), KeepRunning: ptr(false)},
	}
	if err := f.cl.Create(context.Background(), cp); err != nil {
		f.t.Fatal(err)
	}
}

// TestConnectDuringPause: a connect that comes while a pause is under way
// waits for it and resumes the sandbox, as E2B's does, instead of
// answering "running" for a sandbox about to stop.
func TestConnectDuringPause(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	f.beginPause(id)
	type answer struct {
		code int
		sb   sandboxBody
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.code = f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, &a.sb)
		done <- a
	}()
	select {
	case a := <-done:
		t.Fatalf("connect during a pause answered %d at once, want it to wait for the pause", a.code)
	case <-time.After(200 * time.Millisecond):
	}
	f.controllerPauses("team-a", podName(id, 0))
	select {
	case a := <-done:
		if a.code != http.StatusCreated || a.sb.SandboxID != id {
			t.Fatalf("connect once the pause is done: %d %+v, want 201 (resumed)", a.code, a.sb)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connect still waits 10 s after the pause ended")
	}
	if p := f.pod("team-a", podName(id, 1)); p.Labels[LabelSandbox] != id {
		t.Errorf("resumed pod %+v", p.ObjectMeta)
	}
}

// TestDeleteSnapshotByName: deleteSnapshot takes the name given to
// createSnapshot, as E2B's template delete takes an alias: every snapshot
// of that name goes, others stay.
func TestDeleteSnapshotByName(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	var one, two, other snapshotBody
	for _, c := range []struct {
		name string
		out  *snapshotBody
	}{{"warm", &one}, {"warm", &two}, {"cold", &other}} {
		if code := f.do("key-a", "POST", "/sandboxes/"+id+"/snapshots", `{"name":"`+c.name+`"}`, c.out); code != http.StatusCreated {
			t.Fatalf("createSnapshot %s: %d", c.name, code)
		}
	}
	if code := f.do("key-b", "DELETE", "/templates/warm", "", nil); code != http.StatusNotFound {
		t.Errorf("delete by name with another namespace's key: %d, want 404", code)
	}
	if code := f.do("key-a", "DELETE", "/templates/warm", "", nil); code != http.StatusNoContent {
		t.Fatalf("delete snapshot by name: %d, want 204", code)
	}
	for _, s := range []snapshotBody{one, two} {
		var cp cryov1.Checkpoint
		err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: s.SnapshotID}, &cp)
		if err == nil && cp.DeletionTimestamp == nil {
			t.Errorf("snapshot %s of name warm still there", s.SnapshotID)
		}
	}
	var cp cryov1.Checkpoint
	if err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: other.SnapshotID}, &cp); err != nil {
		t.Errorf("snapshot cold: %v, want kept", err)
	}
	if code := f.do("key-a", "DELETE", "/templates/warm", "", nil); code != http.StatusNotFound {
		t.Errorf("second delete by name: %d, want 404 (the SDK's false)", code)
	}
}

// TestSetTimeoutOfPausedSandbox: setTimeout of a paused sandbox answers
// 404, as E2B's, and changes nothing (the connect that resumes it gives
// its timeout); during the pause it answers 409.
func TestSetTimeoutOfPausedSandbox(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{"timeout":60}`)
	f.beginPause(id)
	var e apiError
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/timeout", `{"timeout":3600}`, &e); code != http.StatusConflict || e.Message == "" {
		t.Fatalf("setTimeout during the pause: %d %+v, want 409", code, e)
	}
	f.controllerPauses("team-a", podName(id, 0))
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var d listedBody
		if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code == http.StatusOK && d.State == "paused" {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the sandbox is not paused 10 s after its pause")
		}
	}
	paused := f.checkpoint("team-a", podName(id, 0)).Annotations[annEndAt]
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/timeout", `{"timeout":3600}`, &e); code != http.StatusNotFound || e.Message == "" {
		t.Fatalf("setTimeout of the paused sandbox: %d %+v, want 404", code, e)
	}
	if got := f.checkpoint("team-a", podName(id, 0)).Annotations[annEndAt]; got != paused {
		t.Fatalf("the paused sandbox's end time moved from %s to %s", paused, got)
	}
}

// TestGetInfoDuringPauseEnd: between a pause's pod deletion and its
// Checkpoint's Succeeded, getInfo waits for the pause instead of
// answering 404 (the SDK's SandboxNotFoundError for a sandbox being
// paused), and then answers paused.
func TestGetInfoDuringPauseEnd(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	f.beginPause(id)
	f.deletePod(podName(id, 0))
	type answer struct {
		code int
		d    listedBody
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.code = f.do("key-a", "GET", "/sandboxes/"+id, "", &a.d)
		done <- a
	}()
	select {
	case a := <-done:
		t.Fatalf("getInfo while the pause ends answered %d %+v at once, want it to wait for the pause", a.code, a.d)
	case <-time.After(200 * time.Millisecond):
	}
	cp := f.checkpoint("team-a", podName(id, 0))
	cp.Status.Phase = cryov1.PhaseSucceeded
	if err := f.cl.Update(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		if a.code != http.StatusOK || a.d.State != "paused" {
			t.Fatalf("getInfo once the pause is done: %d %+v, want 200 paused", a.code, a.d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("getInfo still waits 10 s after the pause ended")
	}
}
