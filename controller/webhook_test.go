package controller

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := cryov1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func ckpt(ns, name string, phase cryov1.Phase, mutate func(*cryov1.Checkpoint)) *cryov1.Checkpoint {
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       cryov1.CheckpointSpec{PodName: "src"},
		Status:     cryov1.CheckpointStatus{Phase: phase},
	}
	if phase == cryov1.PhaseSucceeded {
		cp.Status.Snapshot = "s3://snapshots/cryo/" + ns + "/pods@" + testDigest
	}
	if mutate != nil {
		mutate(cp)
	}
	return cp
}

func TestWebhookDecisions(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	past, future := metav1.NewTime(now.Add(-time.Minute)), metav1.NewTime(now.Add(time.Hour))
	objs := []*cryov1.Checkpoint{
		ckpt("team-a", "good", cryov1.PhaseSucceeded, nil),
		ckpt("team-a", "good-ttl", cryov1.PhaseSucceeded, func(c *cryov1.Checkpoint) { c.Status.ExpireTime = &future }),
		ckpt("team-a", "expired", cryov1.PhaseSucceeded, func(c *cryov1.Checkpoint) { c.Status.ExpireTime = &past }),
		ckpt("team-a", "broken", cryov1.PhaseFailed, func(c *cryov1.Checkpoint) {
			c.Status.Reason, c.Status.Message = cryov1.ReasonNotCryoPod, "pod src runs under RuntimeClass runc"
		}),
		ckpt("team-a", "busy", cryov1.PhaseCreating, nil),
		ckpt("team-a", "new", "", nil),
		ckpt("team-b", "theirs", cryov1.PhaseSucceeded, nil),
	}
	b := fake.NewClientBuilder().WithScheme(testScheme(t))
	for _, o := range objs {
		b = b.WithObjects(o)
	}
	m := &PodMutator{Reader: b.Build(), DefaultStore: "s3://snapshots/cryo", RuntimeClasses: []string{"cryo", "cryo-gpu"}, Now: func() time.Time { return now }}
	cryo, cryoGPU, runc := "cryo", "cryo-gpu", "runc"
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		class   *string
		want    map[string]string // annotations that must be set
		absent  string            // an annotation that must not be set
		label   string            // LabelRuntimeClass's value, "" for none
		warning string            // the one admission warning, "" for none
		wantErr string
	}{
		{name: "restore by name", ann: map[string]string{AnnotationRestoreCheckpoint: "good"}, class: &cryo, want: map[string]string{
			AnnotationRestoreFrom: "s3://snapshots/cryo/team-a/pods:cp-uid-good", AnnotationRestoreDigest: testDigest,
			AnnotationCheckpointTo: "s3://snapshots/cryo/team-a/pods:pod-dst"}, label: "cryo"},
		{name: "kruise alias", ann: map[string]string{AnnotationKruiseRestoreFrom: "good-ttl"}, class: &cryo, want: map[string]string{
			AnnotationRestoreFrom: "s3://snapshots/cryo/team-a/pods:cp-uid-good-ttl", AnnotationRestoreDigest: testDigest}, label: "cryo"},
		{name: "own checkpoint target kept", ann: map[string]string{AnnotationRestoreCheckpoint: "good", AnnotationCheckpointTo: "s3://mine/x:y"},
			class: &cryo, want: map[string]string{AnnotationCheckpointTo: "s3://mine/x:y"}, label: "cryo"},
		// Only cryo reads restore-from: a runc pod would boot fresh, silently.
		{name: "restore into a runc pod", ann: map[string]string{AnnotationRestoreCheckpoint: "good"}, class: &runc,
			wantErr: `restore from Checkpoint "good": spec.runtimeClassName "runc" is not a cryo RuntimeClass (cryo, cryo-gpu)`},
		{name: "kruise restore into a runc pod", ann: map[string]string{AnnotationKruiseRestoreFrom: "good"}, class: &runc,
			wantErr: `spec.runtimeClassName "runc" is not a cryo RuntimeClass`},
		// No class: the node's default runtime decides; admitted, warned.
		{name: "restore without a RuntimeClass", ann: map[string]string{AnnotationRestoreCheckpoint: "good"}, want: map[string]string{
			AnnotationRestoreFrom: "s3://snapshots/cryo/team-a/pods:cp-uid-good", AnnotationRestoreDigest: testDigest,
			AnnotationCheckpointTo: "s3://snapshots/cryo/team-a/pods:pod-dst"},
			warning: "spec.runtimeClassName is not set: the pod is restored from the Checkpoint only if its node's default runtime is cryo's, otherwise it starts fresh from its image (cryo RuntimeClasses: cryo, cryo-gpu)"},
		{name: "missing", ann: map[string]string{AnnotationRestoreCheckpoint: "nope"}, wantErr: `Checkpoint "nope" not found in namespace "team-a"`},
		{name: "other namespace", ann: map[string]string{AnnotationRestoreCheckpoint: "theirs"}, wantErr: `Checkpoint "theirs" not found in namespace "team-a"`},
		{name: "failed", ann: map[string]string{AnnotationRestoreCheckpoint: "broken"}, wantErr: `Checkpoint "broken" failed (NotCryoPod): pod src runs under RuntimeClass runc`},
		{name: "creating", ann: map[string]string{AnnotationRestoreCheckpoint: "busy"}, wantErr: `Checkpoint "busy" has not yet succeeded (phase Creating)`},
		{name: "pending", ann: map[string]string{AnnotationKruiseRestoreFrom: "new"}, wantErr: `Checkpoint "new" has not yet succeeded (phase Pending)`},
		{name: "expired", ann: map[string]string{AnnotationRestoreCheckpoint: "expired"}, wantErr: `Checkpoint "expired" expired at 2026-12-05T11:59:00Z`},
		{name: "two names", ann: map[string]string{AnnotationRestoreCheckpoint: "good", AnnotationKruiseRestoreFrom: "good-ttl"}, wantErr: "different Checkpoints"},
		{name: "empty name", ann: map[string]string{AnnotationRestoreCheckpoint: ""}, wantErr: "is empty"},
		{name: "cryo pod gets a target", class: &cryo, want: map[string]string{AnnotationCheckpointTo: "s3://snapshots/cryo/team-a/pods:pod-dst"}, label: "cryo"},
		{name: "cryo pod with its own target", ann: map[string]string{AnnotationCheckpointTo: "s3://mine/x:y"}, class: &cryo, label: "cryo"},
		{name: "second cryo class", class: &cryoGPU, label: "cryo-gpu"},
		{name: "other pod untouched", absent: AnnotationCheckpointTo},
		{name: "runc pod untouched", class: &runc, absent: AnnotationCheckpointTo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dst", Annotations: tc.ann},
				Spec: corev1.PodSpec{RuntimeClassName: tc.class, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			resp := m.Handle(context.Background(), admissionRequest(t, "team-a", pod))
			if tc.wantErr != "" {
				msg := ""
				if resp.Result != nil {
					msg = resp.Result.Message
				}
				if resp.Allowed || !strings.Contains(msg, tc.wantErr) {
					t.Fatalf("allowed %v, message %q, want a denial %q", resp.Allowed, msg, tc.wantErr)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			if tc.warning == "" && len(resp.Warnings) != 0 || tc.warning != "" && (len(resp.Warnings) != 1 || resp.Warnings[0] != tc.warning) {
				t.Errorf("warnings %q, want %q", resp.Warnings, tc.warning)
			}
			if len(resp.Warnings) == 1 && len(resp.Warnings[0]) > 256 {
				t.Errorf("warning of %d characters: the API server truncates beyond 256", len(resp.Warnings[0]))
			}
			got, labels := applyPatch(t, pod, resp)
			if labels[LabelRuntimeClass] != tc.label {
				t.Errorf("label %s = %q, want %q (labels %v)", LabelRuntimeClass, labels[LabelRuntimeClass], tc.label, labels)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, got[k], v)
				}
			}
			if _, ok := got[tc.absent]; tc.absent != "" && ok {
				t.Errorf("annotation %s set on a pod the webhook does not concern", tc.absent)
			}
		})
	}
}

func TestWebhookGeneratedName(t *testing.T) {
	m := &PodMutator{DefaultStore: "s3://b/cryo", RuntimeClasses: []string{"cryo"}}
	cryo := "cryo"
	a := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "web-"}, Spec: corev1.PodSpec{RuntimeClassName: &cryo}}
	b := a.DeepCopy()
	if _, err := m.Mutate(context.Background(), "ns", a); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Mutate(context.Background(), "ns", b); err != nil {
		t.Fatal(err)
	}
	ta, tb := a.Annotations[AnnotationCheckpointTo], b.Annotations[AnnotationCheckpointTo]
	if !strings.HasPrefix(ta, "s3://b/cryo/ns/pods:pod-web-") || ta == tb {
		t.Fatalf("targets of two generated pods: %q, %q: want distinct pod-web-<random>", ta, tb)
	}
}

func admissionRequest(t *testing.T, ns string, pod *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req", Namespace: ns, Operation: admissionv1.Create,
		Kind:   metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Object: runtime.RawExtension{Raw: raw},
	}}
}

// applyPatch applies the response's JSON patch to the pod's
// annotations and labels, the only fields the webhook may change.
func applyPatch(t *testing.T, pod *corev1.Pod, resp admission.Response) (ann, labels map[string]string) {
	t.Helper()
	ann, labels = maps.Clone(pod.Annotations), maps.Clone(pod.Labels)
	if ann == nil {
		ann = map[string]string{}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	unescape := strings.NewReplacer("~1", "/", "~0", "~")
	for _, p := range resp.Patches {
		m := map[string]map[string]string{"annotations": ann, "labels": labels}
		field, key, _ := strings.Cut(strings.TrimPrefix(p.Path, "/metadata/"), "/")
		dst, ok := m[field]
		switch {
		case !ok || !strings.HasPrefix(p.Path, "/metadata/"):
			t.Fatalf("unexpected patch %+v", p)
		case key == "" && p.Operation == "add":
			for k, v := range p.Value.(map[string]any) {
				dst[k] = v.(string)
			}
		case key != "" && (p.Operation == "add" || p.Operation == "replace"):
			dst[unescape.Replace(key)] = p.Value.(string)
		default:
			t.Fatalf("unexpected patch %+v", p)
		}
	}
	return ann, labels
}
