// Package v1alpha1 is the cryo.dev/v1alpha1 API: the Checkpoint resource
// that cmd/cryo-controller reconciles (docs/controller.md).
//
// +kubebuilder:object:generate=true
// +groupName=cryo.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the Checkpoint resource.
	GroupVersion = schema.GroupVersion{Group: "cryo.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
