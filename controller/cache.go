package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// LabelRuntimeClass marks a pod of one of cryo's RuntimeClasses; its value
// is the class. The webhook sets it on every such pod it admits, and the
// E2B API on the pods it makes. The controller's cache holds only the pods
// that carry it with one of its classes (PodCache), so its memory follows
// cryo's pods, not the cluster's. The ValidatingAdmissionPolicy
// cryo-runtime-class-label (packaging/kubernetes/controller) lets a pod
// carry it only with its own spec.runtimeClassName as the value, so a
// tenant cannot put a runc pod in the cache.
//
// It chooses what is watched, never what is acted on: a pod's creator can
// remove it, and without that policy set it, so the reconciler still
// checks spec.runtimeClassName, and reads a pod without it from the API
// server.
const LabelRuntimeClass = "cryo.dev/runtime-class"

// PodCache is the manager's cache configuration for pods (cache.Options
// ByObject): only those labelled LabelRuntimeClass with one of classes
// (the controller's cryo RuntimeClasses), and without their managedFields,
// which nothing here reads and which are often the larger part of a pod.
// The value is matched, not only the key: the admission policy makes the
// value the pod's real RuntimeClass, and any class may be named there, so
// only the list decides which classes are cryo's. A class that cannot be a
// label value is an error (the webhook could not label its pods either).
func PodCache(classes []string) (cache.ByObject, error) {
	if len(classes) == 0 {
		return cache.ByObject{}, fmt.Errorf("no cryo RuntimeClass to select pods by")
	}
	req, err := labels.NewRequirement(LabelRuntimeClass, selection.In, classes)
	if err != nil {
		return cache.ByObject{}, fmt.Errorf("RuntimeClasses %v as values of label %s: %w", classes, LabelRuntimeClass, err)
	}
	return cache.ByObject{Label: labels.NewSelector().Add(*req), Transform: cache.TransformStripManagedFields()}, nil
}

// getPod reads a pod from the cache and, when the cache does not hold it,
// from the API server: a pod created before the label existed or while the
// webhook was down has none, and one created a moment ago may not have
// reached the cache yet. A pod not found is then the API server's answer.
// Only a Checkpoint naming the pod costs that read.
func (r *Reconciler) getPod(ctx context.Context, key types.NamespacedName, pod *corev1.Pod) error {
	err := r.Client.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		err = r.APIReader.Get(ctx, key, pod)
	}
	return err
}
