package e2bapi

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// podEnds plays the kubelet when a sandbox's VM or container dies: pod
// ns/name ends in phase ph (restartPolicy Never), and stays.
func (f *fixture) podEnds(ns, name string, ph corev1.PodPhase) {
	f.t.Helper()
	p := f.pod(ns, name)
	p.Status.Phase = ph
	if err := f.cl.Status().Update(context.Background(), p); err != nil {
		f.t.Fatal(err)
	}
}

// gone fails unless sandbox id is gone for the SDK: getInfo, connect,
// setTimeout, pause, snapshot, fork and metrics answer 404, no list shows
// it, and the gateway answers E2B's "not found" without starting a pod.
func (f *gatewayFixture) gone(id string) {
	f.t.Helper()
	for _, r := range [][3]string{
		{"GET", "/sandboxes/" + id, ""},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{}`},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":60}`},
		{"POST", "/sandboxes/" + id + "/pause", `{}`},
		{"POST", "/sandboxes/" + id + "/snapshots", `{}`},
		{"POST", "/sandboxes/" + id + "/fork", `{}`},
		{"GET", "/sandboxes/" + id + "/metrics", ""},
	} {
		var e apiError
		if code := f.do("key-a", r[0], r[1], r[2], &e); code != http.StatusNotFound {
			f.t.Errorf("ended sandbox %s: %s %s: %d %+v, want 404", id, r[0], r[1], code, e)
		}
	}
	for _, q := range []string{"", "?state=running", "?state=paused"} {
		var list []listedBody
		f.do("key-a", "GET", "/v2/sandboxes"+q, "", &list)
		for _, d := range list {
			if d.SandboxID == id {
				f.t.Errorf("ended sandbox %s listed by /v2/sandboxes%s as %s", id, q, d.State)
			}
		}
	}
	pods := f.cc.pods.Load()
	code, _, body := f.send(id, "GET", "/health", "", nil)
	f.refusal(code, body, 502, id, "The sandbox was not found")
	if n := f.cc.pods.Load() - pods; n != 0 {
		f.t.Errorf("the gateway started %d pods for ended sandbox %s", n, id)
	}
}

// TestEnded: a sandbox whose pod ended (Failed or Succeeded: its VM or
// container died) is gone for the SDK at once, as on E2B, even when it
// was paused before and its Checkpoint could resume it (that would bring
// back a state its owner went past), even with autoResume. Its objects
// stay until its timeout, when the reaper removes every one of them as a
// kill does, also for an autoPause sandbox (nothing to pause); a kill
// removes them sooner. A pod that stops because a pause stopped its VM
// is no end: the sandbox is paused.
func TestEnded(t *testing.T) {
	f := newGatewayFixture(t)
	ctx := context.Background()

	died := f.create("key-a", `{"templateID":"base","timeout":60}`)
	f.podEnds("team-a", podName(died, 0), corev1.PodFailed)
	exited := f.create("key-a", `{"templateID":"base","timeout":60,"autoPause":true}`)
	f.podEnds("team-a", podName(exited, 0), corev1.PodSucceeded)
	// Paused, resumed, then its VM died.
	resumed := f.create("key-a", `{"templateID":"base","timeout":60,"autoPause":true,"autoResume":{"enabled":true}}`)
	f.controllerPauses("team-a", podName(resumed, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+resumed+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+resumed+"/connect", `{"timeout":60}`, nil); code != http.StatusCreated {
		t.Fatalf("connect: %d", code)
	}
	f.podEnds("team-a", podName(resumed, 1), corev1.PodFailed)
	// Paused by a Checkpoint that stopped its VM: the pod ended, and
	// stays until the controller deletes it.
	paused := f.create("key-a", `{"templateID":"base","timeout":60}`)
	pcp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: podName(paused, 0),
		Labels: map[string]string{LabelSandbox: paused}, Annotations: f.pod("team-a", podName(paused, 0)).Annotations},
		Spec: cryov1.CheckpointSpec{PodName: podName(paused, 0), KeepRunning: ptr(false)}}
	if err := f.cl.Create(ctx, pcp); err != nil {
		t.Fatal(err)
	}
	pcp.Status.Phase = cryov1.PhaseSucceeded
	if err := f.cl.Update(ctx, pcp); err != nil {
		t.Fatal(err)
	}
	f.podEnds("team-a", podName(paused, 0), corev1.PodSucceeded)
	running := f.create("key-a", `{"templateID":"base","timeout":60}`)

	for _, id := range []string{died, exited, resumed} {
		f.gone(id)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+paused, "", &d); code != 200 || d.State != "paused" {
		t.Errorf("a sandbox whose pause stopped its pod: %d %+v, want paused", code, d)
	}
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != 200 || len(list) != 2 {
		t.Errorf("list: %d %+v, want the paused and the running sandbox", code, list)
	}

	// Before their timeout, a tick leaves them: their pods tell why they
	// died.
	r := &Reaper{Server: f.srv, Cache: f.cl}
	f.now = f.now.Add(30 * time.Second)
	r.Reap(ctx)
	for _, name := range []string{podName(died, 0), podName(exited, 0), podName(resumed, 1)} {
		if p := f.pod("team-a", name); p.DeletionTimestamp != nil {
			t.Errorf("pod %s removed before its timeout", name)
		}
	}
	// At their timeout, a tick removes what a kill removes.
	f.now = f.now.Add(time.Minute)
	r.Reap(ctx)
	for _, id := range []string{died, exited, resumed} {
		f.removed(id)
	}
	var cps cryov1.CheckpointList
	if err := f.cl.List(ctx, &cps, client.MatchingLabels{LabelSandbox: exited}); err != nil || len(cps.Items) != 0 {
		t.Errorf("the ended autoPause sandbox was paused: %v %d Checkpoints", err, len(cps.Items))
	}
	if code := f.do("key-a", "GET", "/sandboxes/"+paused, "", &d); code != 200 || d.State != "paused" {
		t.Errorf("the paused sandbox after its timeout: %d %+v, want paused still", code, d)
	}
	if code := f.do("key-a", "GET", "/sandboxes/"+running, "", &d); code != 404 {
		t.Errorf("the running sandbox after its timeout: %d %+v, want killed", code, d)
	}

	// A kill does not wait for the timeout.
	early := f.create("key-a", `{"templateID":"base","timeout":3600}`)
	f.podEnds("team-a", podName(early, 0), corev1.PodFailed)
	if code := f.do("key-a", "DELETE", "/sandboxes/"+early, "", nil); code != http.StatusNoContent {
		t.Errorf("kill of an ended sandbox: %d", code)
	}
	f.removed(early)
}

// removed fails unless sandbox id has no pod, Checkpoint or token Secret
// left.
func (f *fixture) removed(id string) {
	f.t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	var cps cryov1.CheckpointList
	if err := f.cl.List(ctx, &pods, client.MatchingLabels{LabelSandbox: id}); err != nil || len(pods.Items) != 0 {
		f.t.Errorf("sandbox %s: %v, %d pods left", id, err, len(pods.Items))
	}
	if err := f.cl.List(ctx, &cps, client.MatchingLabels{LabelSandbox: id}); err != nil || len(cps.Items) != 0 {
		f.t.Errorf("sandbox %s: %v, %d Checkpoints left", id, err, len(cps.Items))
	}
	if err := f.cl.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: tokenSecretName(id)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		f.t.Errorf("sandbox %s: token Secret: %v, want gone", id, err)
	}
}

// TestGatewayEnded: the gateway's reads of the API server for a sandbox
// its cache shows paused find it gone when it is: resumed since and ended
// (a pod the cache does not hold), or killed since. Either answers "not
// found" at once, starts no pod, and does not wait for ReadyWait.
func TestGatewayEnded(t *testing.T) {
	f := newGatewayFixture(t)
	var ids []string
	for range 2 {
		id := f.create("key-a", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`)
		f.controllerPauses("team-a", podName(id, 0))
		if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
			t.Fatalf("pause: %d", code)
		}
		ids = append(ids, id)
	}
	stale := staleCache(t, f.fixture)
	resumed, killed := ids[0], ids[1]
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+resumed+"/connect", `{}`, nil); code != http.StatusCreated {
		t.Fatalf("connect: %d", code)
	}
	f.podEnds("team-a", podName(resumed, 1), corev1.PodFailed)
	if code := f.do("key-a", "DELETE", "/sandboxes/"+killed, "", nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}

	f.gw.Cache = stale
	f.gw.ReadyWait = time.Minute
	for _, id := range ids {
		pods := f.cc.pods.Load()
		start := time.Now()
		code, _, body := f.send(id, "GET", "/health", "", nil)
		f.refusal(code, body, 502, id, "The sandbox was not found")
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("sandbox %s: the answer took %s", id, took)
		}
		if n := f.cc.pods.Load() - pods; n != 0 {
			t.Errorf("sandbox %s: the gateway started %d pods", id, n)
		}
	}
}
