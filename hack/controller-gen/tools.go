//go:build tools

// Package tools pins controller-gen, which generates the Checkpoint CRD and
// the deepcopy functions of api/v1alpha1 (hack/gen-controller.sh). A module
// of its own so that controller-tools' dependencies stay out of cryo's.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
