// Package controller holds the controller's manifests that the controller
// itself checks the cluster against: what it finds in force must be what
// is shipped here.
package controller

import _ "embed"

// E2BLabels is e2b-labels.yaml: the E2B label guard, its policy and its
// binding (e2bapi.CheckLabelGuard).
//
//go:embed e2b-labels.yaml
var E2BLabels []byte
