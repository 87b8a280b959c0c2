package e2bapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// keyLabelValue is what a key Secret's LabelAPIKey may hold: the first 63
// hex digits of the key's SHA-256 (a label value has at most 63
// characters), so that a request reads only its own key's Secret.
func keyLabelValue(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:63]
}

// authenticate maps an API key to its namespace, reading the key Secrets
// from Server.Keys: the Secrets labelled with the key's hash first, then
// those with an empty label value (keys set up without the hash). The
// label only narrows the search: the key itself is compared, in constant
// time, so a wrong label can hide a key but never admit another.
func (s *Server) authenticate(ctx context.Context, key string) (string, error) {
	if key == "" {
		return "", errf(http.StatusUnauthorized, "Invalid API key")
	}
	for _, v := range []string{keyLabelValue(key), ""} {
		var secrets corev1.SecretList
		if err := s.keys().List(ctx, &secrets, client.InNamespace(s.Namespace), client.MatchingLabels{LabelAPIKey: v}); err != nil {
			return "", fmt.Errorf("list API key Secrets: %w", err)
		}
		for _, sec := range secrets.Items {
			want := sec.Data[SecretKeyField]
			if len(want) == 0 || subtle.ConstantTimeCompare(want, []byte(key)) != 1 {
				continue
			}
			ns := sec.Annotations[AnnotationKeyNamespace]
			if ns == "" {
				return "", errf(http.StatusUnauthorized, "API key Secret %s has no annotation %s", sec.Name, AnnotationKeyNamespace)
			}
			return ns, nil
		}
	}
	return "", errf(http.StatusUnauthorized, "Invalid API key")
}

func (s *Server) keys() client.Reader {
	if s.Keys != nil {
		return s.Keys
	}
	return s.Client
}

// KeyCache is the configuration of Server.Keys's cache: the Secrets of
// namespace ns (the controller's) labelled LabelAPIKey, each reduced to
// what authenticate reads. Any API request names a key, and whoever can
// reach the API can send any key: with the Secrets read from the API
// server, each such request cost two Secret lists, made by a caller who
// needs no key at all. From this cache a request costs none, a key or
// not, and a deleted Secret still revokes its key as soon as the deletion
// reaches the watch (the informer's lag, milliseconds). A cache of keys
// by hash with a time to live would not help (made-up keys never hit it,
// and a revoked key would live on until its entry expired), and a rate
// limit would let one caller lock every tenant out. The informer lists
// and watches only these Secrets, so what it holds grows with the keys,
// not with the namespace's other Secrets; the controller's Role in its
// namespace already grants that list and watch (the certificate rotator's
// cache watches every Secret there).
func KeyCache(ns string) cache.Options {
	return cache.Options{
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: keySecrets, Transform: keyOnly},
		},
		// Only the Secrets' informer: any other read through this cache
		// is a mistake, not a new watch.
		ReaderFailOnMissingInformer: true,
	}
}

var keySecrets = func() labels.Selector {
	req, err := labels.NewRequirement(LabelAPIKey, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant key
	}
	return labels.NewSelector().Add(*req)
}()

// keyOnly keeps of a key Secret what authenticate reads: its name, the
// label, the namespace annotation and the key. Not the rest (managed
// fields, kubectl's last-applied annotation, which repeats the key).
var keyOnly toolscache.TransformFunc = func(o any) (any, error) {
	sec, ok := o.(*corev1.Secret)
	if !ok {
		return o, nil
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: sec.Namespace, Name: sec.Name, UID: sec.UID, ResourceVersion: sec.ResourceVersion,
			Labels:      map[string]string{LabelAPIKey: sec.Labels[LabelAPIKey]},
			Annotations: map[string]string{AnnotationKeyNamespace: sec.Annotations[AnnotationKeyNamespace]},
		},
		Data: map[string][]byte{SecretKeyField: sec.Data[SecretKeyField]},
	}, nil
}
