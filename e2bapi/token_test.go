package e2bapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func (f *fixture) secret(ns, name string) (*corev1.Secret, error) {
	var sec corev1.Secret
	err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &sec)
	return &sec, err
}

// TestEnvdToken: create hands out a fresh token, keeps it in the Secret
// e2b-<id>, puts its hash on the pod, and gives envd the token and the env
// vars once the pod runs; connect hands out the same token; kill deletes
// the Secret.
func TestEnvdToken(t *testing.T) {
	f := newFixture(t)
	sb := f.createSandbox("key-a", `{"templateID":"base","envVars":{"FOO":"bar"},"secure":false}`)
	token := *sb.EnvdAccessToken
	if other := f.createSandbox("key-a", `{}`); *other.EnvdAccessToken == token {
		t.Errorf("two sandboxes share the token %s", token)
	}
	sec, err := f.secret("team-a", "e2b-"+sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data[SecretTokenField]) != token || sec.Labels[LabelSandbox] != sb.SandboxID {
		t.Errorf("token Secret %+v, want the token and the sandbox label", sec.ObjectMeta)
	}
	p := f.pod("team-a", podName(sb.SandboxID, 0))
	if p.Annotations[AnnotationEnvdTokenSHA256] != sha(token) {
		t.Errorf("pod annotation %s = %q, want the token's sha256", AnnotationEnvdTokenSHA256, p.Annotations[AnnotationEnvdTokenSHA256])
	}
	f.mu.Lock()
	var got *initBody
	for i := range f.inits {
		if f.inits[i].AccessToken == token {
			got = &f.inits[i]
		}
	}
	f.mu.Unlock()
	if got == nil || got.EnvVars["FOO"] != "bar" {
		t.Errorf("envd's /init got %+v, want the token and FOO=bar", got)
	}

	var c sandboxBody
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`, &c); code != 200 || c.EnvdAccessToken == nil || *c.EnvdAccessToken != token {
		t.Errorf("connect: %d %+v, want the sandbox's token", code, c)
	}
	if code := f.do("key-a", "DELETE", "/sandboxes/"+sb.SandboxID, "", nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	if _, err := f.secret("team-a", "e2b-"+sb.SandboxID); !apierrors.IsNotFound(err) {
		t.Errorf("token Secret after kill: %v, want gone", err)
	}
}

// TestInitSandboxEnv: envd's /init carries the sandbox's id and template
// as E2B_SANDBOX_ID and E2B_TEMPLATE_ID, over the user's env vars of those
// names as E2B's envd keeps them, again on resume.
func TestInitSandboxEnv(t *testing.T) {
	f := newFixture(t)
	sb := f.createSandbox("key-a", `{"envVars":{"FOO":"bar","E2B_SANDBOX_ID":"mine","E2B_TEMPLATE_ID":"mine"}}`)
	want := func(what string) {
		t.Helper()
		in := f.lastInit()
		if in.EnvVars["E2B_SANDBOX_ID"] != sb.SandboxID || in.EnvVars["E2B_TEMPLATE_ID"] != "base" || in.EnvVars["FOO"] != "bar" {
			t.Errorf("/init %s: env %v, want E2B_SANDBOX_ID=%s E2B_TEMPLATE_ID=base FOO=bar", what, in.EnvVars, sb.SandboxID)
		}
	}
	want("after create")
	f.controllerPauses("team-a", podName(sb.SandboxID, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`, nil); code != http.StatusCreated {
		t.Fatalf("connect: %d", code)
	}
	want("after resume")
}

// TestCreateFailsWithoutEnvd: a create whose envd refuses /init, or whose
// pod fails, is a 502 that names the cause and leaves nothing behind.
func TestCreateFailsWithoutEnvd(t *testing.T) {
	f := newFixture(t)
	f.initCode.Store(http.StatusUnauthorized)
	var e apiError
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{}`, &e); code != http.StatusBadGateway || e.Code != 502 || !strings.Contains(e.Message, "/init answered 401") {
		t.Errorf("create with envd refusing /init: %d %+v", code, e)
	}
	f.initCode.Store(http.StatusNoContent)
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"metadata":{"fail":"yes"}}`, &e); code != http.StatusBadGateway || !strings.Contains(e.Message, "Failed") {
		t.Errorf("create of a failing pod: %d %+v", code, e)
	}
	f.noneLeft("team-a")
}

// TestCreateRefusedContainer: a container the runtime refuses to create
// (the kubelet would retry for ever) fails the create at once, naming it.
func TestCreateRefusedContainer(t *testing.T) {
	f := newFixture(t)
	f.srv.StartWait = time.Minute
	start := time.Now()
	var e apiError
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"metadata":{"refuse":"yes"}}`, &e); code != http.StatusBadGateway || !strings.Contains(e.Message, "CreateContainerError: unknown cryo annotation") {
		t.Errorf("create: %d %+v", code, e)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("create took %s, want at once", d)
	}
	// The runtime refusing the pod itself is only an Event.
	start = time.Now()
	if code := f.do("key-a", "POST", "/v2/sandboxes", `{"metadata":{"refuse":"sandbox"}}`, &e); code != http.StatusBadGateway ||
		!strings.Contains(e.Message, "FailedCreatePodSandBox") || !strings.Contains(e.Message, "unknown cryo annotation") {
		t.Errorf("create of a refused pod: %d %+v", code, e)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("create took %s, want at once", d)
	}
	f.noneLeft("team-a")
}

// TestCreateInitRetries: envd not yet listening (a 503) is tried again.
func TestCreateInitRetries(t *testing.T) {
	f := newFixture(t)
	f.initCode.Store(http.StatusServiceUnavailable)
	go func() {
		for {
			f.mu.Lock()
			n := len(f.inits)
			f.mu.Unlock()
			if n > 0 {
				f.initCode.Store(http.StatusNoContent)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	f.create("key-a", `{}`)
	if f.mu.Lock(); len(f.inits) < 2 {
		t.Errorf("/init calls %d, want a retry", len(f.inits))
	}
	f.mu.Unlock()
}

func (f *fixture) noneLeft(ns string) {
	f.t.Helper()
	deadline := 0
	for {
		var pods corev1.PodList
		var secs corev1.SecretList
		if err := f.cl.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			f.t.Fatal(err)
		}
		if err := f.cl.List(context.Background(), &secs, client.InNamespace(ns)); err != nil {
			f.t.Fatal(err)
		}
		if len(pods.Items)+len(secs.Items) == 0 {
			return
		}
		if deadline++; deadline > 1000 {
			f.t.Fatalf("left behind: %d pods, %d Secrets", len(pods.Items), len(secs.Items))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResumeKeepsToken: a resumed sandbox's pod carries the same hash and
// envd is given the same token (its memory holds it).
func TestResumeKeepsToken(t *testing.T) {
	f := newFixture(t)
	sb := f.createSandbox("key-a", `{"envVars":{"A":"1"}}`)
	f.controllerPauses("team-a", podName(sb.SandboxID, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	var c sandboxBody
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`, &c); code != http.StatusCreated || c.EnvdAccessToken == nil || *c.EnvdAccessToken != *sb.EnvdAccessToken {
		t.Fatalf("connect: %d %+v", code, c)
	}
	p := f.pod("team-a", podName(sb.SandboxID, 1))
	if p.Status.Phase != corev1.PodRunning || p.Annotations[AnnotationEnvdTokenSHA256] != sha(*sb.EnvdAccessToken) {
		t.Errorf("resumed pod: phase %s, hash %q", p.Status.Phase, p.Annotations[AnnotationEnvdTokenSHA256])
	}
	if in := f.lastInit(); in.AccessToken != *sb.EnvdAccessToken || in.EnvVars["A"] != "1" {
		t.Errorf("/init after resume: %+v", in)
	}
}

// TestConnectWaitsForPod: connect to a sandbox whose pod does not run yet
// (another call is starting it) answers once it runs.
func TestConnectWaitsForPod(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	p := f.pod("team-a", podName(id, 0))
	p.Status.Phase = corev1.PodPending
	if err := f.cl.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		p.Status.Phase = corev1.PodRunning
		_ = f.cl.Status().Update(context.Background(), p)
	}()
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, nil); code != http.StatusOK {
		t.Fatalf("connect: %d", code)
	}
	if ph := f.pod("team-a", podName(id, 0)).Status.Phase; ph != corev1.PodRunning {
		t.Errorf("connect answered while the pod was %s", ph)
	}
}

// TestResumeFails: a resume whose envd refuses /init is a 502, and the
// sandbox is paused as before (its new pod gone, its Checkpoint kept).
func TestResumeFails(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	f.controllerPauses("team-a", podName(id, 0))
	if code := f.do("key-a", "POST", "/sandboxes/"+id+"/pause", `{}`, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	f.initCode.Store(http.StatusUnauthorized)
	var e apiError
	if code := f.do("key-a", "POST", "/v2/sandboxes/"+id+"/connect", `{}`, &e); code != http.StatusBadGateway {
		t.Errorf("connect: %d %+v", code, e)
	}
	var d listedBody
	if code := f.do("key-a", "GET", "/sandboxes/"+id, "", &d); code != 200 || d.State != "paused" {
		t.Errorf("after a failed resume: %d %+v", code, d)
	}
	if _, err := f.secret("team-a", "e2b-"+id); err != nil {
		t.Errorf("token Secret after a failed resume: %v", err)
	}
}

// TestCreateAbandoned: when the SDK gives up (its request timeout) while
// the pod is still pending, the API removes the pod and the Secret.
func TestCreateAbandoned(t *testing.T) {
	f := newFixture(t)
	req, _ := http.NewRequest("POST", f.url+"/v2/sandboxes", strings.NewReader(`{"metadata":{"hang":"yes"}}`))
	req.Header.Set("X-API-KEY", "key-a")
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("create answered %d, want it still waiting", resp.StatusCode)
	}
	f.noneLeft("team-a")
}
