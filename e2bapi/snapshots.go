package e2bapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/controller"
)

const (
	// LabelSnapshot marks a snapshot's Checkpoint (and its token Secret)
	// with the id of the sandbox it was taken of. Snapshots do not carry
	// LabelSandbox: they are no pause of that sandbox and outlive it.
	LabelSnapshot = "cryo.dev/e2b-snapshot"
	// LabelSnapshotName is the name given to createSnapshot: as a
	// template it means the newest snapshot of that name, as on E2B.
	LabelSnapshotName = "cryo.dev/e2b-snapshot-name"

	snapshotPrefix  = "e2b-snap-"
	defaultPageSize = 100
	maxPageSize     = 1000
)

// snapshotName is a label value, which is what a name is stored as.
var snapshotName = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$`)

// snapshotBody is the SDK's SnapshotInfo.
type snapshotBody struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// createSnapshot checkpoints a running sandbox with keepRunning true: the
// sandbox runs on, and the Checkpoint is a template of new sandboxes.
func (s *Server) createSnapshot(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	var b struct {
		Name string `json:"name"`
	}
	if err := decode(r, &b); err != nil {
		return 0, nil, err
	}
	if b.Name != "" && !snapshotName.MatchString(b.Name) {
		return 0, nil, errf(http.StatusBadRequest, "name: %.80q is not usable: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", b.Name)
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.pod == nil {
		return 0, nil, errf(http.StatusConflict, "sandbox %q is paused: connect to it first, or create from its pause Checkpoint %q", sb.id, sb.last.Name)
	}
	cp, err := s.snapshot(ctx, sb, b.Name, "snapshot of sandbox "+sb.id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, snapshotInfo(cp), nil
}

// snapshot makes a Checkpoint of sb's running pod with keepRunning true,
// and a Secret holding sb's envd token beside it (owned by the
// Checkpoint, so that it goes with it), and waits until it succeeded.
func (s *Server) snapshot(ctx context.Context, sb *sandbox, name, what string) (_ *cryov1.Checkpoint, retErr error) {
	token, err := s.token(ctx, sb.ns, tokenSecretName(sb.id))
	if err != nil {
		return nil, err
	}
	labels := map[string]string{LabelSnapshot: sb.id}
	if name != "" {
		labels[LabelSnapshotName] = name
	}
	ann := map[string]string{}
	for _, k := range []string{annTemplate, annEnv, annMetadata} {
		ann[k] = sb.pod.Annotations[k]
	}
	cp := &cryov1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: sb.ns, Name: snapshotPrefix + s.newID(), Labels: labels, Annotations: ann},
		Spec:       cryov1.CheckpointSpec{PodName: sb.pod.Name, KeepRunning: ptr(true)},
	}
	if err := s.Client.Create(ctx, cp); err != nil {
		return nil, fmt.Errorf("create Checkpoint: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := s.Client.Delete(context.WithoutCancel(ctx), cp); err != nil && !apierrors.IsNotFound(err) {
				s.Log.Error(err, "undo a failed snapshot", "checkpoint", cp.Name)
			}
		}
	}()
	owner := metav1.NewControllerRef(cp, cryov1.GroupVersion.WithKind("Checkpoint"))
	if err := s.saveToken(ctx, sb.ns, cp.Name, labels, owner, token); err != nil {
		return nil, err
	}
	s.Log.Info("sandbox snapshotting", "namespace", sb.ns, "sandbox", sb.id, "checkpoint", cp.Name)
	done, err := s.waitCheckpoint(ctx, cp, what)
	if err != nil {
		// The Secret goes with its owner; delete it now anyway, for a
		// cluster without the garbage collector (and the tests).
		_ = s.deleteSecret(context.WithoutCancel(ctx), sb.ns, cp.Name)
		return nil, err
	}
	return done, nil
}

func snapshotInfo(cp *cryov1.Checkpoint) snapshotBody {
	names := []string{}
	if n := cp.Labels[LabelSnapshotName]; n != "" {
		names = append(names, n)
	}
	return snapshotBody{SnapshotID: cp.Name, Names: names}
}

// listSnapshots lists the namespace's Succeeded snapshots by Checkpoint
// name, limit at a time; nextToken is the last name of the page before.
func (s *Server) listSnapshots(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return 0, nil, err
	}
	opts := []client.ListOption{client.InNamespace(ns), client.HasLabels{LabelSnapshot}}
	if id := q.Get("sandboxID"); id != "" {
		opts = []client.ListOption{client.InNamespace(ns), client.MatchingLabels{LabelSnapshot: id}}
	}
	var cps cryov1.CheckpointList
	if err := s.Client.List(ctx, &cps, opts...); err != nil {
		return 0, nil, fmt.Errorf("list Checkpoints: %w", err)
	}
	sort.Slice(cps.Items, func(i, j int) bool { return cps.Items[i].Name < cps.Items[j].Name })
	name, after := q.Get("name"), q.Get("nextToken")
	var page paged
	out := []snapshotBody{}
	for i := range cps.Items {
		cp := &cps.Items[i]
		if !restorable(cp) || cp.Name <= after ||
			(name != "" && name != cp.Name && name != cp.Labels[LabelSnapshotName]) {
			continue
		}
		if len(out) == limit {
			page.next = out[limit-1].SnapshotID
			break
		}
		out = append(out, snapshotInfo(cp))
	}
	page.items = out
	return http.StatusOK, page, nil
}

// paged is a page of a list and the token of the next one, which the
// SDK's paginator reads from the X-Next-Token header.
type paged struct {
	items any
	next  string
}

// deleteSnapshot is the SDK's deleteSnapshot (DELETE /templates/{id}):
// only snapshots are templates one can delete here.
// The id is a snapshot's id or, as on E2B (where a name is the alias of a
// template whose builds are its snapshots), a snapshot name: every
// snapshot of that name goes.
func (s *Server) deleteSnapshot(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	cps, _, err := s.snapshotsNamed(ctx, ns, id)
	if err != nil {
		return 0, nil, err
	}
	// One being deleted (its finalizer untags the snapshot) is gone for
	// the SDK: a second delete answers false.
	cps = slices.DeleteFunc(cps, func(cp cryov1.Checkpoint) bool { return cp.Labels[LabelSnapshot] == "" || cp.DeletionTimestamp != nil })
	if len(cps) == 0 {
		return 0, nil, errf(http.StatusNotFound, "snapshot %q not found (only snapshots can be deleted: template builds are not supported)", id)
	}
	for i := range cps {
		cp := &cps[i]
		if err := s.Client.Delete(ctx, cp); err != nil && !apierrors.IsNotFound(err) {
			return 0, nil, fmt.Errorf("delete Checkpoint %s: %w", cp.Name, err)
		}
		if err := s.deleteSecret(ctx, ns, cp.Name); err != nil {
			return 0, nil, err
		}
		s.Log.Info("snapshot deleted", "namespace", ns, "checkpoint", cp.Name)
	}
	return http.StatusNoContent, nil, nil
}

// snapshotsNamed are the Checkpoints of ns that id names: the one of that
// object name (byName), else those labelled with it as their snapshot name.
func (s *Server) snapshotsNamed(ctx context.Context, ns, id string) (_ []cryov1.Checkpoint, byName bool, _ error) {
	// Only a valid object name is asked for: another ("team/x:v1") would
	// be read as a different path by the API server.
	if len(validation.IsDNS1123Subdomain(id)) == 0 {
		var cp cryov1.Checkpoint
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &cp)
		switch {
		case err == nil:
			return []cryov1.Checkpoint{cp}, true, nil
		case !apierrors.IsNotFound(err):
			return nil, false, fmt.Errorf("get Checkpoint %s: %w", id, err)
		}
	}
	if !snapshotName.MatchString(id) {
		return nil, false, nil
	}
	var cps cryov1.CheckpointList
	if err := s.Client.List(ctx, &cps, client.InNamespace(ns), client.MatchingLabels{LabelSnapshotName: id}); err != nil {
		return nil, false, fmt.Errorf("list Checkpoints: %w", err)
	}
	return cps.Items, false, nil
}

// fromCheckpoint makes l a restore of the Checkpoint a template names: a
// snapshot's id or name, or a paused sandbox's Checkpoint. The new
// sandbox's guest is the Checkpoint's, so its envd holds the source's
// token: the new sandbox id gets a Secret of its own with that token.
func (s *Server) fromCheckpoint(ctx context.Context, l *launch, template string, env map[string]string) error {
	cp, err := s.templateCheckpoint(ctx, l.ns, template)
	if err != nil {
		return err
	}
	tpl, ok := s.Templates[cp.Annotations[annTemplate]]
	if !ok {
		return errf(http.StatusBadRequest, "templateID: Checkpoint %q was not made through the E2B API, or its template %q is no longer configured", cp.Name, cp.Annotations[annTemplate])
	}
	secret := cp.Name
	if src := cp.Labels[LabelSandbox]; src != "" {
		secret = tokenSecretName(src)
	}
	if l.token, err = s.token(ctx, l.ns, secret); err != nil {
		return err
	}
	var srcEnv map[string]string
	_ = json.Unmarshal([]byte(cp.Annotations[annEnv]), &srcEnv)
	// The container keeps the environment it was checkpointed with; the
	// request's env vars reach new processes through envd's /init.
	l.tpl, l.podEnv = tpl, srcEnv
	l.env = maps.Clone(orEmpty(srcEnv))
	maps.Copy(l.env, env)
	l.ann[annTemplate] = cp.Annotations[annTemplate]
	l.ann[annFrom] = cp.Name
	l.ann[controller.AnnotationRestoreCheckpoint] = cp.Name
	return nil
}

// templateCheckpoint finds the Succeeded Checkpoint a template names in
// ns: by name, else the newest snapshot given that name.
func (s *Server) templateCheckpoint(ctx context.Context, ns, template string) (*cryov1.Checkpoint, error) {
	notFound := errf(http.StatusNotFound, "template %q not found (neither a configured template nor a Checkpoint or snapshot of this namespace)", template)
	cps, byName, err := s.snapshotsNamed(ctx, ns, template)
	if err != nil {
		return nil, err
	}
	var cp cryov1.Checkpoint
	if byName {
		cp = cps[0]
	} else {
		var newest *cryov1.Checkpoint
		for i := range cps {
			c := &cps[i]
			if restorable(c) && (newest == nil || newest.CreationTimestamp.Before(&c.CreationTimestamp) ||
				(newest.CreationTimestamp.Equal(&c.CreationTimestamp) && newest.Name < c.Name)) {
				newest = c
			}
		}
		if newest == nil {
			return nil, notFound
		}
		cp = *newest
	}
	if cp.DeletionTimestamp != nil {
		return nil, notFound
	}
	if cp.Status.Phase != cryov1.PhaseSucceeded {
		return nil, errf(http.StatusBadRequest, "templateID: Checkpoint %q has not succeeded (phase %q)", cp.Name, cp.Status.Phase)
	}
	if cp.Labels[LabelSnapshot] == "" && cp.Labels[LabelSandbox] == "" {
		return nil, errf(http.StatusBadRequest, "templateID: Checkpoint %q was not made through the E2B API: its guest has no envd; restore it with a pod annotated %s", cp.Name, controller.AnnotationRestoreCheckpoint)
	}
	return &cp, nil
}

// restorable says a Checkpoint's snapshot can be listed and restored: it
// succeeded and is not being deleted (its finalizer untags the snapshot).
func restorable(cp *cryov1.Checkpoint) bool {
	return cp.Status.Phase == cryov1.PhaseSucceeded && cp.DeletionTimestamp == nil
}
