package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The controller's deployment, as packaging/kubernetes/controller names it.
const (
	ControllerNamespace  = "cryo-system"
	ControllerDeployment = "cryo-controller"
	ControllerImage      = "cryo.dev/cryo-controller:dev"
	// ControllerImageFile is the OCI archive `make controller-image`
	// writes, under _output/images.
	ControllerImageFile = "cryo-controller.tar"
	// StoreCredentials is the Secret the Deployment takes its
	// STORAGE_S3_* environment from.
	StoreCredentials = "cryo-store-credentials"
	// RuncHandler is the runtime handler and RuntimeClass of pods that run
	// under runc, without a VM (the controller's).
	RuncHandler = "runc"
)

// ControllerOverlay is what a kustomization over the packaged controller
// changes for a one-node cluster of this package: the image that `make
// controller-image` built (imported, never pulled), runtimeClassName
// RuncHandler, and the container's environment (KUBERNETES_SERVICE_HOST
// and _PORT at the node, as no kube-proxy serves the kubernetes Service;
// CRYO_DEFAULT_STORE) and extra arguments.
type ControllerOverlay struct {
	Env  map[string]string
	Args []string
}

// WriteControllerOverlay writes the kustomization (kustomization.yaml and
// deployment-patch.json) into dir, over base (packaging/kubernetes/controller).
// The patch names the container the base has (read from the rendered
// base), so that the base may name it as it likes.
func (k *K8s) WriteControllerOverlay(ctx context.Context, dir, base string, o ControllerOverlay) error {
	ctr, err := k.baseControllerContainer(ctx, base)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(o.Env))
	for n := range o.Env {
		names = append(names, n)
	}
	slices.Sort(names)
	env := []map[string]any{}
	for _, n := range names {
		env = append(env, map[string]any{"name": n, "value": o.Env[n]})
	}
	container := map[string]any{"name": ctr.Name, "imagePullPolicy": "Never", "image": ControllerImage, "env": env}
	if len(o.Args) > 0 {
		// A strategic merge patch replaces a list of strings: give all.
		container["args"] = append(slices.Clone(ctr.Args), o.Args...)
	}
	patch := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": ControllerDeployment, "namespace": ControllerNamespace},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"runtimeClassName": RuncHandler,
			"containers":       []any{container},
		}}},
	}
	pb, err := json.MarshalIndent(patch, "", "  ")
	if err != nil {
		return err
	}
	absBase, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	// kustomize refuses an absolute path to a directory resource.
	rel, err := filepath.Rel(absDir, absBase)
	if err != nil {
		return err
	}
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\npatches:\n- path: deployment-patch.json\n", rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"kustomization.yaml": []byte(kust), "deployment-patch.json": pb} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

type baseContainer struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
}

// baseControllerContainer renders the packaged kustomization and returns
// the Deployment's first container.
func (k *K8s) baseControllerContainer(ctx context.Context, base string) (baseContainer, error) {
	out, err := k.KubectlOK(ctx, "create", "--dry-run=client", "-o", "json", "-k", base)
	if err != nil {
		return baseContainer{}, err
	}
	// One JSON object after the other.
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var d struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []baseContainer `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := dec.Decode(&d); err != nil {
			return baseContainer{}, fmt.Errorf("render %s: %w", base, err)
		}
		if d.Kind == "Deployment" && d.Metadata.Name == ControllerDeployment && len(d.Spec.Template.Spec.Containers) > 0 {
			return d.Spec.Template.Spec.Containers[0], nil
		}
	}
	return baseContainer{}, fmt.Errorf("%s has no Deployment %s with a container", base, ControllerDeployment)
}
