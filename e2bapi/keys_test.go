package e2bapi

import (
	"context"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
