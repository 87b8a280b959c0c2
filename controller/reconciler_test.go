package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller/apitest"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// The reconciler runs against a real kube-apiserver and etcd (envtest),
// started once for the package; only the kubelet is faked, by a writer of
// real snapshots into a file:// store.

var (
	envOnce sync.Once
	envCfg  *rest.Config
	envErr  error
	env     *envtest.Environment
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}
	os.Exit(code)
}

// apiServer starts (once) kube-apiserver and etcd from KUBEBUILDER_ASSETS
// (default /var/cache/cryo/tools/bin, where make deps installs them) and
// returns a client of it with the CRD installed and the RuntimeClasses
// cryo and runc.
func apiServer(t *testing.T) client.Client {
	t.Helper()
	envOnce.Do(func() {
		env, envCfg, envErr = apitest.Start(filepath.Join("..", "packaging", "kubernetes", "controller", "crd.yaml"))
		if envErr != nil {
			return
		}
		c, err := client.New(envCfg, client.Options{Scheme: testScheme(t)})
		if err != nil {
			envErr = err
			return
		}
		for _, name := range []string{"cryo", "runc"} {
			rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: name}
			if err := c.Create(context.Background(), rc); err != nil {
				envErr = err
				return
			}
		}
	})
	if envErr != nil {
		t.Fatalf("envtest: %v", envErr)
	}
	c, err := client.New(envCfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fakeKubelet "checkpoints" a pod by writing a real snapshot of it to the
// pod's checkpoint target, as the shim does.
type fakeKubelet struct {
	c     client.Client
	calls atomic.Int32
	// podUID, when set, is written as the snapshot's source pod UID
	// instead of the pod's own.
	podUID string
	// fail, when set, answers the call (called with the call's number,
	// from 1) before anything is written.
	fail func(ctx context.Context, n int32) error
	// block, when set, is waited on after the snapshot is written.
	block chan struct{}
	// answer, when set, is the answer after the snapshot is written.
	answer error
	// holdPrefix, when set, holds the calls for pods of names that begin
	// with it until release is closed, before anything is written.
	holdPrefix string
	release    chan struct{}

	mu               sync.Mutex
	inFlight, maxIn  int
	node, pod, cname string
	// onNode and maxOnNode count the calls in flight per node.
	onNode, maxOnNode map[string]int
}

func (k *fakeKubelet) Checkpoint(ctx context.Context, node, namespace, podName, container string, timeout time.Duration) error {
	n := k.calls.Add(1)
	k.mu.Lock()
	k.inFlight++
	k.maxIn = max(k.maxIn, k.inFlight)
	if k.onNode == nil {
		k.onNode, k.maxOnNode = map[string]int{}, map[string]int{}
	}
	k.onNode[node]++
	k.maxOnNode[node] = max(k.maxOnNode[node], k.onNode[node])
	k.node, k.pod, k.cname = node, namespace+"/"+podName, container
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.inFlight--
		k.onNode[node]--
		k.mu.Unlock()
	}()
	if k.holdPrefix != "" && strings.HasPrefix(podName, k.holdPrefix) {
		select {
		case <-k.release:
		case <-ctx.Done():
			return &KubeletError{Err: ctx.Err()}
		}
	}
	if k.fail != nil {
		if err := k.fail(ctx, n); err != nil {
			return err
		}
	}
	var pod corev1.Pod
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: podName}, &pod); err != nil {
		return &KubeletError{StatusCode: 404, Err: err}
	}
	uid := string(pod.UID)
	if k.podUID != "" {
		uid = k.podUID
	}
	if _, err := writeSnapshot(ctx, pod.Annotations[AnnotationCheckpointTo], uid, int(n)); err != nil {
		return &KubeletError{StatusCode: 500, Err: err}
	}
	if k.block != nil {
		select {
		case <-k.block:
		case <-ctx.Done():
			return &KubeletError{Err: ctx.Err()}
		}
	}
	return k.answer
}

// writeSnapshot publishes a small snapshot of pod uid to target, with the
// metadata annotations the shim writes.
func writeSnapshot(ctx context.Context, target, podUID string, gen int) (string, error) {
	store, tag, err := stores.Open(ctx, target, stores.Options{})
	if err != nil {
		return "", err
	}
	ram := make([]byte, 256<<10)
	for i := range ram {
		ram[i] = byte(i*7 + gen)
	}
	src := &snapshot.Source{
		Metadata: snapshot.Metadata{Source: snapshot.SourceInfo{PodUID: podUID}},
		Files: []snapshot.SourceFile{snapshot.BytesSourceFile(snapshot.FileRAM, ram),
			snapshot.BytesSourceFile(snapshot.FileDevState, []byte(fmt.Sprintf("device state %d", gen)))},
	}
	desc, _, err := snapshot.Write(ctx, store, tag, src, snapshot.WriteOptions{Workers: 1, Uploads: 1,
		Annotations: map[string]string{AnnotationUploadedBytes: "4242", AnnotationPauseWindow: "150ms"}})
	return desc.Digest.String(), err
}

// cluster is one test's namespace, store and running controller.
type cluster struct {
	t        *testing.T
	c        client.Client
	ns       string
	storeDir string
	kubelet  *fakeKubelet
	mgr      ctrl.Manager
	stop     func()
}

type clusterOpts struct {
	deadline  time.Duration
	nodeCalls int
	retryBase time.Duration // 100 ms when zero
	// storeDown, when true, makes every store open fail as an
	// unreachable store's does (transient).
	storeDown *atomic.Bool
}

func newCluster(t *testing.T, k *fakeKubelet, o clusterOpts) *cluster {
	t.Helper()
	c := apiServer(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ckpt-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	k.c = c
	cl := &cluster{t: t, c: c, ns: ns.Name, storeDir: t.TempDir(), kubelet: k}
	cl.start(k, o)
	return cl
}

// start runs a controller (a manager with the reconciler) until stop.
func (cl *cluster) start(k Kubelet, o clusterOpts) {
	t := cl.t
	t.Helper()
	pods, err := PodCache([]string{"cryo"})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(envCfg, ctrl.Options{
		Scheme:                 testScheme(t),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 log.Log,
		// Only this test's namespace: Checkpoints that earlier tests
		// left behind (envtest runs no namespace controller) are not
		// this controller's. Pods as main caches them.
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{cl.ns: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: pods},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	open := StoreOpener(stores.Options{})
	if o.storeDown != nil {
		up := open
		open = func(ctx context.Context, url string) (stores.Store, string, error) {
			if o.storeDown.Load() {
				return nil, "", errors.New("dial tcp: connection refused (the test's store is down)")
			}
			return up(ctx, url)
		}
	}
	if o.retryBase == 0 {
		o.retryBase = 100 * time.Millisecond
	}
	r := &Reconciler{
		Client:             mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Recorder:           mgr.GetEventRecorder("cryo-controller"),
		Kubelet:            k,
		Open:               open,
		RuntimeClasses:     []string{"cryo"},
		StoreBase:          "file://" + cl.storeDir,
		Deadline:           o.deadline,
		RetryBase:          o.retryBase,
		NodeCalls:          o.nodeCalls,
		skipNameValidation: true,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	cl.mgr = mgr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	cl.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(cl.stop)
}

func (cl *cluster) target(pod string) string {
	return "file://" + filepath.Join(cl.storeDir, cl.ns) + ":pod-" + pod
}

// pod creates a Running pod on node-1 (there is no kubelet: the status is
// written directly), labelled as the webhook labels a cryo pod unless
// mutate gave it labels of its own.
func (cl *cluster) pod(name string, mutate func(*corev1.Pod)) *corev1.Pod {
	cl.t.Helper()
	cryo := "cryo"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: cl.ns, Name: name, Annotations: map[string]string{AnnotationCheckpointTo: cl.target(name)}},
		Spec: corev1.PodSpec{RuntimeClassName: &cryo, NodeName: "node-1",
			Containers: []corev1.Container{{Name: "app", Image: "busybox"}, {Name: "side", Image: "busybox"}}},
	}
	phase := corev1.PodRunning
	if mutate != nil {
		mutate(p)
	}
	if p.Labels == nil && isCryoPod(p, []string{"cryo"}) {
		p.Labels = map[string]string{LabelRuntimeClass: *p.Spec.RuntimeClassName}
	}
	if p.Status.Phase != "" {
		phase = p.Status.Phase
	}
	if err := cl.c.Create(context.Background(), p); err != nil {
		cl.t.Fatal(err)
	}
	p.Status.Phase = phase
	if err := cl.c.Status().Update(context.Background(), p); err != nil {
		cl.t.Fatal(err)
	}
	return p
}

func (cl *cluster) checkpoint(name, pod string, mutate func(*cryov1.Checkpoint)) *cryov1.Checkpoint {
	cl.t.Helper()
	cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: cl.ns, Name: name}, Spec: cryov1.CheckpointSpec{PodName: pod}}
	if mutate != nil {
		mutate(cp)
	}
	if err := cl.c.Create(context.Background(), cp); err != nil {
		cl.t.Fatal(err)
	}
	return cp
}

// wait polls the Checkpoint until cond holds (nil Checkpoint: it is gone).
func (cl *cluster) wait(name, what string, cond func(*cryov1.Checkpoint) bool) *cryov1.Checkpoint {
	cl.t.Helper()
	var cp *cryov1.Checkpoint
	end := time.Now().Add(30 * time.Second)
	for {
		cp = &cryov1.Checkpoint{}
		err := cl.c.Get(context.Background(), types.NamespacedName{Namespace: cl.ns, Name: name}, cp)
		if apierrors.IsNotFound(err) {
			cp = nil
		} else if err != nil {
			cl.t.Fatal(err)
		}
		if cond(cp) {
			return cp
		}
		if time.Now().After(end) {
			cl.t.Fatalf("Checkpoint %s: not %s after 30s: %+v", name, what, cp)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (cl *cluster) waitPhase(name string, phase cryov1.Phase) *cryov1.Checkpoint {
	cl.t.Helper()
	return cl.wait(name, string(phase), func(cp *cryov1.Checkpoint) bool { return cp != nil && cp.Status.Phase == phase })
}

// tags are the tags of the namespace's repository in the store.
func (cl *cluster) tags() []string {
	cl.t.Helper()
	store, _, err := stores.Open(context.Background(), "file://"+filepath.Join(cl.storeDir, cl.ns), stores.Options{})
	if err != nil {
		cl.t.Fatal(err)
	}
	tags, err := store.Tags(context.Background())
	if err != nil && !errdefs.IsNotFound(err) {
		cl.t.Fatal(err)
	}
	return tags
}

func (cl *cluster) resolve(tag string) string {
	cl.t.Helper()
	store, _, err := stores.Open(context.Background(), "file://"+filepath.Join(cl.storeDir, cl.ns), stores.Options{})
	if err != nil {
		cl.t.Fatal(err)
	}
	d, err := store.Resolve(context.Background(), tag)
	if err != nil {
		cl.t.Fatalf("resolve %s: %v", tag, err)
	}
	return d.Digest.String()
}

// hasEvent says whether an event with reason was recorded about the
// Checkpoint.
func (cl *cluster) hasEvent(cp *cryov1.Checkpoint, reason string) bool {
	cl.t.Helper()
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		var list eventsv1.EventList
		if err := cl.c.List(context.Background(), &list, client.InNamespace(cl.ns)); err != nil {
			cl.t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.UID == cp.UID && e.Reason == reason {
				return true
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

func condition(cp *cryov1.Checkpoint, t string) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(cp.Status.Conditions, t); c != nil {
		return c.Status
	}
	return "absent"
}

func TestCheckpointSucceeds(t *testing.T) {
	k := &fakeKubelet{}
	cl := newCluster(t, k, clusterOpts{})
	pod := cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)

	tag := "cp-" + string(cp.UID)
	digest := cl.resolve(tag)
	repo := "file://" + filepath.Join(cl.storeDir, cl.ns)
	if cp.Status.Snapshot != repo+"@"+digest || digest != cl.resolve("pod-web") {
		t.Errorf("status.snapshot %q; store: %s names %s, pod-web %s", cp.Status.Snapshot, tag, digest, cl.resolve("pod-web"))
	}
	st := cp.Status
	if st.Node != "node-1" || st.PodUID != string(pod.UID) || st.StoredBytes <= 0 || st.UploadedBytes != 4242 || st.PauseWindow != "150ms" ||
		st.StartTime == nil || st.CompletionTime == nil || st.ExpireTime != nil || st.Reason != "" {
		t.Errorf("status %+v", st)
	}
	if condition(cp, cryov1.ConditionArchived) != metav1.ConditionTrue || condition(cp, cryov1.ConditionReady) != metav1.ConditionTrue ||
		condition(cp, cryov1.ConditionProgressing) != metav1.ConditionFalse {
		t.Errorf("conditions %+v", cp.Status.Conditions)
	}
	if !slicesContain(cp.Finalizers, Finalizer) {
		t.Errorf("finalizers %v, want %s", cp.Finalizers, Finalizer)
	}
	if n := k.calls.Load(); n != 1 || k.node != "node-1" || k.pod != cl.ns+"/web" || k.cname != "app" {
		t.Errorf("kubelet: %d calls, last node %s pod %s container %s; want one for node-1 %s/web app", n, k.node, cl.ns, k.pod, k.cname)
	}
	if !cl.hasEvent(cp, "Succeeded") {
		t.Error("no Succeeded event")
	}
	var p corev1.Pod
	if err := cl.c.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil || !p.DeletionTimestamp.IsZero() {
		t.Errorf("pod after keepRunning (default true): %v, deletion %v", err, p.DeletionTimestamp)
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestCheckpointHibernateDeletesPod(t *testing.T) {
	cl := newCluster(t, &fakeKubelet{}, clusterOpts{})
	pod := cl.pod("sleeper", nil)
	no := false
	cl.checkpoint("c1", "sleeper", func(c *cryov1.Checkpoint) { c.Spec.KeepRunning = &no; c.Spec.ContainerName = "side" })
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)
	if cp.Status.Snapshot == "" || cl.kubelet.cname != "side" {
		t.Fatalf("status %+v, container asked %q", cp.Status, cl.kubelet.cname)
	}
	// Without a kubelet the API server keeps a bound pod, marked for
	// deletion, until its grace period is confirmed.
	var p corev1.Pod
	err := cl.c.Get(context.Background(), client.ObjectKeyFromObject(pod), &p)
	if err == nil && p.DeletionTimestamp.IsZero() {
		t.Fatal("pod not deleted after a keepRunning=false Checkpoint")
	}
	if err == nil && (p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != hibernateGrace) {
		t.Fatalf("hibernated pod deleted with grace period %v, want %ds", p.DeletionGracePeriodSeconds, hibernateGrace)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func TestCheckpointRefusals(t *testing.T) {
	cl := newCluster(t, &fakeKubelet{}, clusterOpts{})
	runc := "runc"
	cl.pod("runc-pod", func(p *corev1.Pod) { p.Spec.RuntimeClassName = &runc })
	// The label only puts a pod in the cache: one its creator forged on a
	// runc pod gains nothing.
	cl.pod("forged-label", func(p *corev1.Pod) {
		p.Spec.RuntimeClassName = &runc
		p.Labels = map[string]string{LabelRuntimeClass: "cryo"}
	})
	cl.pod("pending-pod", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })
	cl.pod("no-target", func(p *corev1.Pod) { p.Annotations = nil })
	cl.pod("ok", nil)
	// A creator may set any target on its pod: another namespace's
	// directory, or a URL elsewhere the controller's credentials reach.
	cl.pod("foreign", func(p *corev1.Pod) {
		p.Annotations[AnnotationCheckpointTo] = "file://" + filepath.Join(cl.storeDir, "other-ns") + ":pod-foreign"
	})
	cl.pod("escape", func(p *corev1.Pod) {
		p.Annotations[AnnotationCheckpointTo] = "file://" + filepath.Join(cl.storeDir, cl.ns) + "/../other-ns:pod-x"
	})
	for _, tc := range []struct {
		name, pod, reason, msg string
		mutate                 func(*cryov1.Checkpoint)
	}{
		{name: "missing", pod: "ghost", reason: cryov1.ReasonPodNotFound, msg: "pod ghost not found in namespace " + cl.ns},
		{name: "not-cryo", pod: "runc-pod", reason: cryov1.ReasonNotCryoPod, msg: "RuntimeClass runc, not a cryo one"},
		{name: "forged-label", pod: "forged-label", reason: cryov1.ReasonNotCryoPod, msg: "RuntimeClass runc, not a cryo one"},
		{name: "not-running", pod: "pending-pod", reason: cryov1.ReasonPodNotRunning, msg: "is Pending, not Running"},
		{name: "no-target", pod: "no-target", reason: cryov1.ReasonNoCheckpointTarget, msg: "no cryo.dev/checkpoint-to"},
		{name: "store", pod: "ok", reason: cryov1.ReasonStoreNotAllowed, msg: "spec.store s3://elsewhere/x is not the pod's checkpoint store",
			mutate: func(c *cryov1.Checkpoint) { c.Spec.Store = "s3://elsewhere/x" }},
		{name: "foreign-store", pod: "foreign", reason: cryov1.ReasonStoreNotAllowed, msg: "outside namespace " + cl.ns + "'s store"},
		{name: "escape-store", pod: "escape", reason: cryov1.ReasonStoreNotAllowed, msg: "outside namespace " + cl.ns + "'s store"},
		{name: "container", pod: "ok", reason: cryov1.ReasonInvalidSpec, msg: `spec.containerName "db"`,
			mutate: func(c *cryov1.Checkpoint) { c.Spec.ContainerName = "db" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl.checkpoint(tc.name, tc.pod, tc.mutate)
			cp := cl.waitPhase(tc.name, cryov1.PhaseFailed)
			if cp.Status.Reason != tc.reason || !strings.Contains(cp.Status.Message, tc.msg) {
				t.Errorf("reason %q message %q, want %s and %q", cp.Status.Reason, cp.Status.Message, tc.reason, tc.msg)
			}
			if condition(cp, cryov1.ConditionReady) != metav1.ConditionFalse {
				t.Errorf("Ready %v", condition(cp, cryov1.ConditionReady))
			}
			if !cl.hasEvent(cp, tc.reason) {
				t.Errorf("no %s event", tc.reason)
			}
		})
	}
	if n := cl.kubelet.calls.Load(); n != 0 {
		t.Errorf("the kubelet was called %d times for refused Checkpoints", n)
	}
}

func TestCheckpointInvalidSpecRefusedByTheAPI(t *testing.T) {
	cl := newCluster(t, &fakeKubelet{}, clusterOpts{})
	for _, mutate := range []func(*cryov1.Checkpoint){
		func(c *cryov1.Checkpoint) { c.Spec.PersistentContents = []cryov1.PersistentContent{"gpu"} },
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "1 week" },
		// What the old pattern admitted and ParseTTL refuses (the
		// Checkpoint then failed InvalidSpec): compound or fractional days,
		// zero, beyond 3650d.
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "1d12h" },
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "1.5d" },
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "0s" },
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "9999d" },
		func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "87601h" },
	} {
		cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: cl.ns, Name: "bad"}, Spec: cryov1.CheckpointSpec{PodName: "p"}}
		mutate(cp)
		if err := cl.c.Create(context.Background(), cp); !apierrors.IsInvalid(err) {
			t.Errorf("create %+v: %v, want Invalid", cp.Spec, err)
		}
	}
	cp := cl.checkpoint("defaults", "p", nil)
	if cp.Spec.KeepRunning == nil || !*cp.Spec.KeepRunning || len(cp.Spec.PersistentContents) != 2 {
		t.Errorf("defaults: keepRunning %v, persistentContents %v", cp.Spec.KeepRunning, cp.Spec.PersistentContents)
	}
	// A patch, which carries no resourceVersion: the controller updates
	// the Checkpoint meanwhile, and an update would meet a conflict first.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"podName":"other"}}`))
	if err := cl.c.Patch(context.Background(), cp, patch); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
		t.Errorf("update of the spec: %v, want Invalid: spec is immutable", err)
	}
}

func TestCheckpointTTLAndDeletionUntag(t *testing.T) {
	cl := newCluster(t, &fakeKubelet{}, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("short", "web", func(c *cryov1.Checkpoint) { c.Spec.TTLAfterFinished = "2s" })
	short := cl.waitPhase("short", cryov1.PhaseSucceeded)
	if short.Status.ExpireTime == nil || short.Status.ExpireTime.Sub(short.Status.CompletionTime.Time) != 2*time.Second {
		t.Fatalf("expireTime %v, completionTime %v", short.Status.ExpireTime, short.Status.CompletionTime)
	}
	cl.checkpoint("kept", "web", nil)
	kept := cl.waitPhase("kept", cryov1.PhaseSucceeded)
	if tags := cl.tags(); !slicesContain(tags, "cp-"+string(short.UID)) || !slicesContain(tags, "cp-"+string(kept.UID)) {
		t.Fatalf("tags %v", tags)
	}
	cl.wait("short", "expired and deleted", func(cp *cryov1.Checkpoint) bool { return cp == nil })
	tags := cl.tags()
	if slicesContain(tags, "cp-"+string(short.UID)) || !slicesContain(tags, "cp-"+string(kept.UID)) || !slicesContain(tags, "pod-web") {
		t.Fatalf("tags after the TTL of %s: %v: want only its cp- tag gone", short.Name, tags)
	}
	if err := cl.c.Delete(context.Background(), kept); err != nil {
		t.Fatal(err)
	}
	cl.wait("kept", "deleted", func(cp *cryov1.Checkpoint) bool { return cp == nil })
	if tags := cl.tags(); slicesContain(tags, "cp-"+string(kept.UID)) || !slicesContain(tags, "pod-web") {
		t.Fatalf("tags after deleting %s: %v", kept.Name, tags)
	}
}

func TestCheckpointRetriesTransientFailures(t *testing.T) {
	k := &fakeKubelet{fail: func(_ context.Context, n int32) error {
		if n == 1 {
			return &KubeletError{StatusCode: 503, Err: errors.New("proxy: no route to node-1")}
		}
		return nil
	}}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)
	if n := k.calls.Load(); n != 2 {
		t.Errorf("%d kubelet calls, want 2 (one 503, one retry)", n)
	}
	if !cl.hasEvent(cp, cryov1.ReasonKubeletFailed) {
		t.Error("no KubeletFailed event for the retried attempt")
	}
}

// TestCheckpointRetryWaitsItsBackoff: a retry comes after its backoff
// (100 ms, 200 ms, 400 ms here), not at once: the status write of the
// failed attempt must not turn into the next call (a kubelet that is
// restarting would get them all within its restart, and answer the last
// with a 404 that fails the Checkpoint).
func TestCheckpointRetryWaitsItsBackoff(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	k := &fakeKubelet{fail: func(_ context.Context, n int32) error {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if n <= 3 {
			return &KubeletError{StatusCode: 503, Err: errors.New("dial tcp: connection refused")}
		}
		return nil
	}}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cl.waitPhase("c1", cryov1.PhaseSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 4 {
		t.Fatalf("%d kubelet calls, want 4 (three 503s, one success)", len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap, min := at[i].Sub(at[i-1]), 100*time.Millisecond<<(i-1); gap < min {
			t.Errorf("call %d came %v after call %d, want at least its backoff %v", i+1, gap, i, min)
		}
	}
}

// TestCheckpointLateFailureTimesOutAtOnce: a call that fails after the
// deadline (its timeout runs to it) fails the Checkpoint with Timeout at
// once, not after the retry's backoff (20 s here, up to a minute).
func TestCheckpointLateFailureTimesOutAtOnce(t *testing.T) {
	var failed atomic.Int64
	k := &fakeKubelet{fail: func(_ context.Context, n int32) error {
		time.Sleep(4 * time.Second)
		failed.Store(time.Now().UnixNano())
		return &KubeletError{StatusCode: 503, Err: errors.New("dial tcp: connection refused")}
	}}
	cl := newCluster(t, k, clusterOpts{deadline: 3 * time.Second, retryBase: 20 * time.Second})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseFailed)
	late := cp.Status.CompletionTime.Sub(time.Unix(0, failed.Load()))
	if cp.Status.Reason != cryov1.ReasonTimeout || late > 3*time.Second || k.calls.Load() != 1 {
		t.Fatalf("%s %q %v after the failed call, %d calls; want Timeout at once after one call", cp.Status.Reason, cp.Status.Message, late, k.calls.Load())
	}
}

// TestCheckpointSlotWaitThenStoreDown: a Checkpoint that waited for a slot
// and then finds its store down fails with Timeout once its deadline,
// counted from the end of its wait, passes; before, each retry took the
// wait's message for a new wait and restarted the deadline, and the
// Checkpoint stayed Pending for as long as the store was down.
func TestCheckpointSlotWaitThenStoreDown(t *testing.T) {
	var down atomic.Bool
	cl := secondWaitsForSlot(t, 3*time.Second, clusterOpts{deadline: 5 * time.Second, storeDown: &down})
	down.Store(true)
	second := cl.wait("second", "finished", func(cp *cryov1.Checkpoint) bool { return cp != nil && finished(cp) })
	if second.Status.Reason != cryov1.ReasonTimeout || !strings.Contains(second.Status.Message, "connection refused") {
		t.Fatalf("second Checkpoint %s %s: %s, want a Timeout naming the store's error", second.Status.Phase, second.Status.Reason, second.Status.Message)
	}
}

func TestCheckpointPermanentKubeletFailure(t *testing.T) {
	k := &fakeKubelet{fail: func(context.Context, int32) error {
		return &KubeletError{StatusCode: 404, Err: errors.New("the server could not find the requested resource")}
	}}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseFailed)
	if cp.Status.Reason != cryov1.ReasonKubeletFailed || !strings.Contains(cp.Status.Message, "HTTP 404") || k.calls.Load() != 1 {
		t.Errorf("reason %s message %q after %d calls", cp.Status.Reason, cp.Status.Message, k.calls.Load())
	}
}

// TestCheckpointAdoptsAfterAFailedAnswer: the shim published, then the
// answer failed, with a status that is not retried: the snapshot is
// recorded, not refused nor asked for again.
func TestCheckpointAdoptsAfterAFailedAnswer(t *testing.T) {
	k := &fakeKubelet{answer: &KubeletError{StatusCode: 400, Err: errors.New("the answer was lost")}}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)
	if n := k.calls.Load(); n != 1 || !strings.HasSuffix(cp.Status.Snapshot, "@"+cl.resolve("pod-web")) {
		t.Errorf("%d kubelet calls, snapshot %s", n, cp.Status.Snapshot)
	}
}

func TestCheckpointDeadline(t *testing.T) {
	k := &fakeKubelet{fail: func(context.Context, int32) error {
		return &KubeletError{StatusCode: 503, Err: errors.New("kubelet unreachable")}
	}}
	cl := newCluster(t, k, clusterOpts{deadline: 2 * time.Second})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseFailed)
	if cp.Status.Reason != cryov1.ReasonTimeout || !strings.Contains(cp.Status.Message, "kubelet unreachable") || k.calls.Load() < 2 {
		t.Errorf("reason %s message %q after %d calls", cp.Status.Reason, cp.Status.Message, k.calls.Load())
	}
	if took := cp.Status.CompletionTime.Sub(cp.Status.StartTime.Time); took < 2*time.Second || took > 10*time.Second {
		t.Errorf("failed %s after the start, deadline 2s", took)
	}
}

func TestCheckpointRefusesAnotherPodsSnapshot(t *testing.T) {
	k := &fakeKubelet{podUID: "0b5e7a1e-0000-0000-0000-000000000000"}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cp := cl.waitPhase("c1", cryov1.PhaseFailed)
	if cp.Status.Reason != cryov1.ReasonSnapshotNotFound || !strings.Contains(cp.Status.Message, "pod UID \"0b5e7a1e") || cp.Status.Snapshot != "" {
		t.Errorf("reason %s message %q snapshot %q", cp.Status.Reason, cp.Status.Message, cp.Status.Snapshot)
	}
	if slicesContain(cl.tags(), "cp-"+string(cp.UID)) {
		t.Error("another pod's snapshot was tagged")
	}
}

func TestCheckpointSerializesOnePod(t *testing.T) {
	k := &fakeKubelet{block: make(chan struct{})}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("first", "web", nil)
	cl.wait("first", "asked", func(*cryov1.Checkpoint) bool { return k.calls.Load() == 1 })
	cl.checkpoint("second", "web", nil)
	second := cl.wait("second", "waiting", func(cp *cryov1.Checkpoint) bool {
		return cp.Status.Phase == cryov1.PhasePending && cp.Status.Message == "waiting for Checkpoint first of the same pod"
	})
	if n := k.calls.Load(); n != 1 {
		t.Fatalf("%d kubelet calls while the first Checkpoint runs: %+v", n, second.Status)
	}
	close(k.block)
	a, b := cl.waitPhase("first", cryov1.PhaseSucceeded), cl.waitPhase("second", cryov1.PhaseSucceeded)
	if a.Status.Snapshot == b.Status.Snapshot || k.maxIn != 1 {
		t.Errorf("snapshots %s and %s, %d calls at once", a.Status.Snapshot, b.Status.Snapshot, k.maxIn)
	}
}

// TestCheckpointRestartAdopts: a controller stopped while the kubelet call
// runs (the snapshot already published) leaves the Checkpoint in Creating;
// the next one finds the snapshot in the store and records it without
// asking the kubelet again.
func TestCheckpointRestartAdopts(t *testing.T) {
	first := &fakeKubelet{block: make(chan struct{})}
	cl := newCluster(t, first, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cl.wait("c1", "asked", func(cp *cryov1.Checkpoint) bool {
		return first.calls.Load() == 1 && cp.Status.Phase == cryov1.PhaseCreating && cp.Status.RequestTime != nil &&
			slicesContain(cl.tags(), "pod-web")
	})
	published := cl.resolve("pod-web")
	cl.stop()
	if cp := cl.waitPhase("c1", cryov1.PhaseCreating); cp.Status.Snapshot != "" {
		t.Fatalf("stopped controller recorded %s", cp.Status.Snapshot)
	}

	second := &fakeKubelet{c: cl.c}
	cl.start(second, clusterOpts{})
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)
	if !strings.HasSuffix(cp.Status.Snapshot, "@"+published) || cl.resolve("cp-"+string(cp.UID)) != published {
		t.Errorf("snapshot %s, want the one published before the restart, %s", cp.Status.Snapshot, published)
	}
	if n := second.calls.Load(); n != 0 {
		t.Errorf("the restarted controller asked the kubelet %d times", n)
	}
}

// TestCheckpointRestartWaitsForACallInFlight: with nothing in the store
// yet, a restarted controller does not ask again while its predecessor's
// call may still run on the node.
func TestCheckpointRestartWaitsForACallInFlight(t *testing.T) {
	// The first controller's call never answers: it is cut by the stop.
	first := &fakeKubelet{fail: func(ctx context.Context, _ int32) error {
		<-ctx.Done()
		return &KubeletError{Err: ctx.Err()}
	}}
	cl := newCluster(t, first, clusterOpts{})
	cl.pod("web", nil)
	cl.checkpoint("c1", "web", nil)
	cl.wait("c1", "asked", func(*cryov1.Checkpoint) bool { return first.calls.Load() == 1 })
	cl.stop()

	// The call that may still run takes the node's one slot: another
	// pod's Checkpoint on that node waits for it.
	second := &fakeKubelet{c: cl.c}
	cl.start(second, clusterOpts{nodeCalls: 1})
	cl.waitPhase("c1", cryov1.PhaseCreating)
	cl.pod("other", nil)
	cl.checkpoint("c2", "other", nil)
	time.Sleep(3 * time.Second)
	cp := cl.waitPhase("c1", cryov1.PhaseCreating)
	if n := second.calls.Load(); n != 0 {
		t.Errorf("asked the kubelet %d times within the predecessor's call timeout (%ds from %s)", n, cp.Status.RequestTimeoutSeconds, cp.Status.RequestTime)
	}
	if c2 := cl.waitPhase("c2", cryov1.PhasePending); !strings.HasPrefix(c2.Status.Message, waitingSlot) {
		t.Errorf("c2 beside a predecessor's call in flight on its node: %q, want it waiting for the node's slot", c2.Status.Message)
	}
}

// TestPodCacheAndUnlabelledPods: the controller's cache holds the pods the
// webhook labelled and no other, not a runc pod (labelled with its own
// class or not) nor a cryo pod admitted
// without the label (created before it existed, or while the webhook was
// down); a Checkpoint of such a pod still succeeds, read from the API
// server, and hibernates it.
func TestPodCacheAndUnlabelledPods(t *testing.T) {
	cl := newCluster(t, &fakeKubelet{}, clusterOpts{})
	runc := "runc"
	cl.pod("labelled", nil)
	cl.pod("runc-pod", func(p *corev1.Pod) { p.Spec.RuntimeClassName = &runc })
	// Labelled with its own class, as the admission policy allows: the
	// cache selects cryo's classes only.
	cl.pod("runc-labelled", func(p *corev1.Pod) {
		p.Spec.RuntimeClassName = &runc
		p.Labels = map[string]string{LabelRuntimeClass: runc}
	})
	old := cl.pod("old", func(p *corev1.Pod) { p.Labels = map[string]string{} })
	// Events come in order: once the last pod is cached, any of the
	// others that the cache took would be there too.
	cl.pod("last", nil)

	ctx := context.Background()
	var names []string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var pods corev1.PodList
		if err := cl.mgr.GetCache().List(ctx, &pods, client.InNamespace(cl.ns)); err != nil {
			t.Fatal(err)
		}
		names = names[:0]
		for _, p := range pods.Items {
			names = append(names, p.Name)
			if len(p.ManagedFields) != 0 {
				t.Errorf("cached pod %s keeps its managedFields", p.Name)
			}
		}
		if slicesContain(names, "last") || time.Now().After(end) {
			break
		}
	}
	if len(names) != 2 || !slicesContain(names, "labelled") || !slicesContain(names, "last") {
		t.Fatalf("the controller's cache holds pods %v, want only labelled and last", names)
	}
	var p corev1.Pod
	if err := cl.mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(old), &p); !apierrors.IsNotFound(err) {
		t.Fatalf("cache Get of the unlabelled pod: %v, want NotFound", err)
	}

	no := false
	cl.checkpoint("c1", "old", func(c *cryov1.Checkpoint) { c.Spec.KeepRunning = &no })
	cp := cl.waitPhase("c1", cryov1.PhaseSucceeded)
	if cp.Status.PodUID != string(old.UID) || cp.Status.Snapshot == "" {
		t.Errorf("status %+v", cp.Status)
	}
	err := cl.c.Get(ctx, client.ObjectKeyFromObject(old), &p)
	if err == nil && p.DeletionTimestamp.IsZero() {
		t.Error("unlabelled pod not deleted after a keepRunning=false Checkpoint")
	}
}

// slowCheckpoints creates n pods slow-<i> on node-1 and a Checkpoint of
// each, named as its pod (a fakeKubelet with holdPrefix "slow-" holds
// their calls).
func (cl *cluster) slowCheckpoints(n int) {
	for i := range n {
		name := fmt.Sprintf("slow-%d", i)
		cl.pod(name, nil)
		cl.checkpoint(name, name, nil)
	}
}

// TestCheckpointCallsDoNotHoldWorkers: a kubelet call lasts as long as
// the checkpoint on its node; calls that do not answer for a while (four
// big VMs, a node gone) do not stop another pod's Checkpoint, which
// succeeds meanwhile.
func TestCheckpointCallsDoNotHoldWorkers(t *testing.T) {
	k := &fakeKubelet{holdPrefix: "slow-", release: make(chan struct{})}
	cl := newCluster(t, k, clusterOpts{nodeCalls: 8})
	cl.slowCheckpoints(4)
	cl.wait("slow-0", "four calls held", func(*cryov1.Checkpoint) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.inFlight == 4
	})
	cl.pod("fast", nil)
	cl.checkpoint("fast", "fast", nil)
	cl.waitPhase("fast", cryov1.PhaseSucceeded)
	close(k.release)
	for i := range 4 {
		cl.waitPhase(fmt.Sprintf("slow-%d", i), cryov1.PhaseSucceeded)
	}
}

// TestCheckpointWaitIsNotItsTime: a Checkpoint that waits for another of
// the same pod begins its deadline when it may begin, not when it was
// created: it succeeds after a wait longer than its deadline.
func TestCheckpointWaitIsNotItsTime(t *testing.T) {
	k := &fakeKubelet{fail: func(_ context.Context, n int32) error {
		if n == 1 {
			time.Sleep(7 * time.Second)
		}
		return nil
	}}
	cl := newCluster(t, k, clusterOpts{deadline: 6 * time.Second})
	cl.pod("web", nil)
	cl.checkpoint("first", "web", nil)
	cl.wait("first", "asked", func(*cryov1.Checkpoint) bool { return k.calls.Load() == 1 })
	cl.checkpoint("second", "web", nil)
	cl.waitPhase("first", cryov1.PhaseSucceeded)
	second := cl.wait("second", "finished", func(cp *cryov1.Checkpoint) bool { return cp != nil && finished(cp) })
	if second.Status.Phase != cryov1.PhaseSucceeded {
		t.Fatalf("second Checkpoint %s %s: %s, want Succeeded after its wait", second.Status.Phase, second.Status.Reason, second.Status.Message)
	}
}

// TestCheckpointDeletedWhileCreating: a Checkpoint deleted while its
// kubelet call runs leaves no cp- tag on the snapshot the call publishes
// (the store would keep its blobs for good).
func TestCheckpointDeletedWhileCreating(t *testing.T) {
	k := &fakeKubelet{block: make(chan struct{})}
	cl := newCluster(t, k, clusterOpts{})
	cl.pod("web", nil)
	cp := cl.checkpoint("c1", "web", nil)
	cl.wait("c1", "asked", func(cp *cryov1.Checkpoint) bool {
		return cp.Status.Phase == cryov1.PhaseCreating && slicesContain(cl.tags(), "pod-web")
	})
	if err := cl.c.Delete(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	close(k.block)
	cl.wait("c1", "deleted", func(cp *cryov1.Checkpoint) bool { return cp == nil })
	time.Sleep(time.Second) // what the call's answer would still do
	if tags := cl.tags(); slicesContain(tags, "cp-"+string(cp.UID)) || !slicesContain(tags, "pod-web") {
		t.Fatalf("tags after the Checkpoint was deleted while creating: %v, want pod-web and no cp-%s", tags, cp.UID)
	}
}

// TestCheckpointNodeCallsBounded: no more than NodeCalls kubelet calls
// run on one node; the others wait in Pending, saying so, while another
// node's Checkpoint goes ahead, and each begins as a slot frees.
func TestCheckpointNodeCallsBounded(t *testing.T) {
	k := &fakeKubelet{holdPrefix: "slow-", release: make(chan struct{})}
	cl := newCluster(t, k, clusterOpts{nodeCalls: 2})
	cl.slowCheckpoints(4)
	cl.wait("slow-0", "two calls held", func(*cryov1.Checkpoint) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.onNode["node-1"] == 2
	})
	cl.pod("other-node", func(p *corev1.Pod) { p.Spec.NodeName = "node-2" })
	cl.checkpoint("other-node", "other-node", nil)
	cl.waitPhase("other-node", cryov1.PhaseSucceeded)
	time.Sleep(2 * pollInterval) // every waiter has asked again
	var waiting []string
	for i := range 4 {
		cp := &cryov1.Checkpoint{}
		if err := cl.c.Get(context.Background(), types.NamespacedName{Namespace: cl.ns, Name: fmt.Sprintf("slow-%d", i)}, cp); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(cp.Status.Message, waitingSlot+"node-1") {
			if cp.Status.Phase != cryov1.PhasePending {
				t.Errorf("Checkpoint %s waits for a slot in phase %s, want Pending", cp.Name, cp.Status.Phase)
			}
			waiting = append(waiting, cp.Name)
		}
	}
	if len(waiting) != 2 {
		t.Fatalf("Checkpoints waiting for a slot on node-1: %v, want 2 (2 calls held)", waiting)
	}
	for range 4 {
		k.release <- struct{}{}
	}
	for i := range 4 {
		if cp := cl.waitPhase(fmt.Sprintf("slow-%d", i), cryov1.PhaseSucceeded); cp.Status.Message != "" {
			t.Errorf("Checkpoint %s succeeded with message %q", cp.Name, cp.Status.Message)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.maxOnNode["node-1"] != 2 {
		t.Fatalf("at most %d calls at once on node-1, want 2", k.maxOnNode["node-1"])
	}
}

// TestCheckpointSlotWaitIsNotItsTime: the wait for a node's slot does
// not count against a Checkpoint's deadline, and a freed slot wakes its
// waiter at once (no poll's delay).
func TestCheckpointSlotWaitIsNotItsTime(t *testing.T) {
	cl := secondWaitsForSlot(t, 7*time.Second, clusterOpts{deadline: 6 * time.Second})
	first := cl.waitPhase("first", cryov1.PhaseSucceeded)
	second := cl.wait("second", "finished", func(cp *cryov1.Checkpoint) bool { return cp != nil && finished(cp) })
	if second.Status.Phase != cryov1.PhaseSucceeded {
		t.Fatalf("second Checkpoint %s %s: %s, want Succeeded after its wait", second.Status.Phase, second.Status.Reason, second.Status.Message)
	}
	if !second.Status.RequestTime.Time.Before(first.Status.CompletionTime.Add(2 * time.Second)) {
		t.Fatalf("second asked at %s, the first completed at %s: the freed slot did not wake it", second.Status.RequestTime, first.Status.CompletionTime)
	}
}

// secondWaitsForSlot runs a controller of one slot per node (o's other
// options) whose first kubelet call takes hold, and two Checkpoints of
// pods first and second on one node: it returns once the first asked and
// the second waits for the slot.
func secondWaitsForSlot(t *testing.T, hold time.Duration, o clusterOpts) *cluster {
	t.Helper()
	k := &fakeKubelet{fail: func(_ context.Context, n int32) error {
		if n == 1 {
			time.Sleep(hold)
		}
		return nil
	}}
	o.nodeCalls = 1
	cl := newCluster(t, k, o)
	cl.pod("first", nil)
	cl.pod("second", nil)
	cl.checkpoint("first", "first", nil)
	cl.wait("first", "asked", func(*cryov1.Checkpoint) bool { return k.calls.Load() == 1 })
	cl.checkpoint("second", "second", nil)
	cl.wait("second", "waiting", func(cp *cryov1.Checkpoint) bool {
		return strings.HasPrefix(cp.Status.Message, waitingSlot)
	})
	return cl
}
