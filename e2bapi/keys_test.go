package e2bapi

import (
	"context"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// countingSecrets counts the key Secrets the API reads.
type countingSecrets struct {
	client.Client
	n *int
}

func (c countingSecrets) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	err := c.Client.List(ctx, l, opts...)
	if sl, ok := l.(*corev1.SecretList); ok {
		*c.n += len(sl.Items)
	}
	return err
}

// TestKeyLookup: a key Secret labelled with its key's hash is found
// without reading the other keys; its deletion revokes it at once; a
// label naming another key's hash admits nothing.
func TestKeyLookup(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: "team-c", Labels: map[string]string{LabelAPIKey: keyLabelValue("key-c")},
			Annotations: map[string]string{AnnotationKeyNamespace: "team-c"}},
		Data: map[string][]byte{SecretKeyField: []byte("key-c")},
	}
	wrong := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: "team-d", Labels: map[string]string{LabelAPIKey: keyLabelValue("key-c")},
			Annotations: map[string]string{AnnotationKeyNamespace: "team-d"}},
		Data: map[string][]byte{SecretKeyField: []byte("key-d")},
	}
	for _, s := range []*corev1.Secret{sec, wrong} {
		if err := f.cl.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	read := 0
	f.srv.Client = countingSecrets{f.cl, &read}
	var list []listedBody
	if code := f.do("key-c", "GET", "/v2/sandboxes", "", &list); code != http.StatusOK {
		t.Fatalf("hashed key: %d", code)
	}
	if read != 2 {
		t.Errorf("a hashed key read %d key Secrets, want the 2 with its hash only", read)
	}
	var e apiError
	if code := f.do("key-d", "GET", "/v2/sandboxes", "", &e); code != http.StatusUnauthorized {
		t.Errorf("a key whose Secret's label is another key's hash: %d, want 401", code)
	}
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != http.StatusOK {
		t.Errorf("a key with an empty label value: %d", code)
	}
	if err := f.cl.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if code := f.do("key-c", "GET", "/v2/sandboxes", "", &e); code != http.StatusUnauthorized {
		t.Errorf("deleted key: %d, want 401 at once", code)
	}
}

// TestKeyCacheTransform: the key cache keeps of a key Secret what
// authenticate reads, not kubectl's last-applied copy of it nor any other
// data, and passes a deletion's tombstone through.
func TestKeyCacheTransform(t *testing.T) {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cryo-system", Name: "team-c", ResourceVersion: "7",
			Labels: map[string]string{LabelAPIKey: "h", "app": "x"},
			Annotations: map[string]string{AnnotationKeyNamespace: "team-c",
				"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"apiKey":"a2V5LWM="}}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Data: map[string][]byte{SecretKeyField: []byte("key-c"), "other": []byte("x")},
	}
	o, err := keyOnly(sec)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*corev1.Secret)
	if len(got.Annotations) != 1 || got.Annotations[AnnotationKeyNamespace] != "team-c" || len(got.Labels) != 1 || got.Labels[LabelAPIKey] != "h" ||
		len(got.Data) != 1 || string(got.Data[SecretKeyField]) != "key-c" || got.ManagedFields != nil || got.Name != "team-c" || got.ResourceVersion != "7" {
		t.Errorf("cached key Secret %+v", got)
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "cryo-system/team-c", Obj: sec}
	if o, err := keyOnly(tomb); err != nil || o != any(tomb) {
		t.Errorf("a tombstone: %v %v", o, err)
	}
}
