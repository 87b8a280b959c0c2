package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// WebhookPath is where the API server sends pod admission requests.
const WebhookPath = "/mutate-v1-pod"

// PodMutator is the mutating webhook for pods: it resolves a restore by
// Checkpoint name into cryo.dev/restore-from and cryo.dev/restore-digest
// (refusing a pod whose runtimeClassName is not a cryo one, warning when it
// has none), and gives cryo pods their default checkpoint target and the label
// LabelRuntimeClass, which puts them in the controller's cache.
type PodMutator struct {
	// Reader reads Checkpoints; the API server itself (not a cache), so a
	// Checkpoint that just succeeded is seen.
	Reader client.Reader
	// DefaultStore is the base URL of the namespaces' repositories ("":
	// no default checkpoint target).
	DefaultStore   string
	RuntimeClasses []string
	Now            func() time.Time
}

// Handle answers one admission request.
func (m *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode pod: %w", err))
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	mutated := pod.DeepCopy()
	warnings, err := m.Mutate(ctx, ns, mutated)
	if err != nil {
		if apierrors.IsNotFound(err) || isDenial(err) {
			return admission.Denied(err.Error())
		}
		return admission.Errored(http.StatusInternalServerError, err)
	}
	raw, err := json.Marshal(mutated)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	resp.Warnings = warnings
	return resp
}

// denial is a refusal of the pod, its message naming the Checkpoint.
type denial struct{ msg string }

func (d *denial) Error() string { return d.msg }

func isDenial(err error) bool {
	_, ok := err.(*denial)
	return ok
}

func deny(format string, args ...any) error { return &denial{fmt.Sprintf(format, args...)} }

// Mutate sets the pod's annotations (a denial error refuses the pod) and
// returns the admission warnings for the user.
func (m *PodMutator) Mutate(ctx context.Context, namespace string, pod *corev1.Pod) (warnings []string, err error) {
	name, restore, err := restoreName(pod)
	if err != nil {
		return nil, err
	}
	cryo := isCryoPod(pod, m.RuntimeClasses)
	if restore {
		// Only cryo's runtime reads restore-from: under another one the pod
		// would silently boot fresh from its image.
		if rc := pod.Spec.RuntimeClassName; rc != nil && !cryo {
			return nil, deny("restore from Checkpoint %q: spec.runtimeClassName %q is not a cryo RuntimeClass (%s); only cryo restores a Checkpoint, under another runtime the pod would start fresh from its image",
				name, *rc, strings.Join(m.RuntimeClasses, ", "))
		}
		from, digest, err := m.resolve(ctx, namespace, name)
		if err != nil {
			return nil, err
		}
		setAnnotation(pod, AnnotationRestoreFrom, from)
		setAnnotation(pod, AnnotationRestoreDigest, digest)
		if pod.Spec.RuntimeClassName == nil {
			// Kept under the 256 characters the API server passes on.
			warnings = append(warnings, fmt.Sprintf("spec.runtimeClassName is not set: the pod is restored from the Checkpoint only if its node's default runtime is cryo's, otherwise it starts fresh from its image (cryo RuntimeClasses: %s)",
				strings.Join(m.RuntimeClasses, ", ")))
		}
	}
	if (restore || cryo) && m.DefaultStore != "" && pod.Annotations[AnnotationCheckpointTo] == "" {
		setAnnotation(pod, AnnotationCheckpointTo, DefaultTarget(m.DefaultStore, namespace, podNameForTag(pod)))
	}
	if cryo {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[LabelRuntimeClass] = *pod.Spec.RuntimeClassName
	}
	return warnings, nil
}

// restoreName is the Checkpoint a pod asks to be restored from, by the
// cryo annotation or OpenKruise Agents' alias.
func restoreName(pod *corev1.Pod) (string, bool, error) {
	a, aok := pod.Annotations[AnnotationRestoreCheckpoint]
	k, kok := pod.Annotations[AnnotationKruiseRestoreFrom]
	switch {
	case aok && kok && a != k:
		return "", false, deny("%s %q and %s %q name different Checkpoints", AnnotationRestoreCheckpoint, a, AnnotationKruiseRestoreFrom, k)
	case aok:
		k = a
	case !kok:
		return "", false, nil
	}
	if k == "" {
		return "", false, deny("annotation %s is empty: it names a Checkpoint", AnnotationRestoreCheckpoint)
	}
	return k, true, nil
}

// resolve returns the restore-from URL ("<repo>:cp-<uid>") and digest of a
// Succeeded, unexpired Checkpoint of the namespace.
func (m *PodMutator) resolve(ctx context.Context, namespace, name string) (string, string, error) {
	var cp cryov1.Checkpoint
	err := m.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &cp)
	if apierrors.IsNotFound(err) {
		return "", "", deny("Checkpoint %q not found in namespace %q", name, namespace)
	}
	if err != nil {
		return "", "", fmt.Errorf("read Checkpoint %s/%s: %w", namespace, name, err)
	}
	now := time.Now()
	if m.Now != nil {
		now = m.Now()
	}
	switch {
	case cp.Status.Phase == cryov1.PhaseFailed:
		return "", "", deny("Checkpoint %q failed (%s): %s", name, cp.Status.Reason, cp.Status.Message)
	case cp.Status.Phase != cryov1.PhaseSucceeded:
		phase := cp.Status.Phase
		if phase == "" {
			phase = cryov1.PhasePending
		}
		return "", "", deny("Checkpoint %q has not yet succeeded (phase %s)", name, phase)
	case !cp.DeletionTimestamp.IsZero():
		return "", "", deny("Checkpoint %q is being deleted", name)
	case cp.Status.ExpireTime != nil && !now.Before(cp.Status.ExpireTime.Time):
		return "", "", deny("Checkpoint %q expired at %s", name, cp.Status.ExpireTime.UTC().Format(time.RFC3339))
	}
	repo, digest, ok := splitSnapshot(cp.Status.Snapshot)
	if !ok {
		return "", "", deny("Checkpoint %q: status.snapshot %q is not <repo>@sha256:<hex>", name, cp.Status.Snapshot)
	}
	return repo + ":" + checkpointTag(&cp), digest, nil
}

// podNameForTag is the pod's name, or for a pod named by generateName
// (admitted before its name is made) the prefix and a random suffix.
func podNameForTag(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return pod.GenerateName + hex.EncodeToString(b)
}

func setAnnotation(pod *corev1.Pod, k, v string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[k] = v
}
