package e2bapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// keyLabelValue is what a key Secret's LabelAPIKey may hold: the first 63
// hex digits of the key's SHA-256 (a label value has at most 63
// characters), so that a request lists only its own key's Secret.
func keyLabelValue(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:63]
}

// authenticate maps an API key to its namespace. Keys are read on every
// request, without a cache, so that a deleted Secret revokes its key at
// once. The Secrets labelled with the key's hash are listed first; then
// those with an empty label value (keys set up without the hash). The
// label only narrows the search: the key itself is compared, in constant
// time, so a wrong label can hide a key but never admit another.
func (s *Server) authenticate(ctx context.Context, key string) (string, error) {
	if key == "" {
		return "", errf(http.StatusUnauthorized, "Invalid API key")
	}
	for _, v := range []string{keyLabelValue(key), ""} {
		var secrets corev1.SecretList
		if err := s.Client.List(ctx, &secrets, client.InNamespace(s.Namespace), client.MatchingLabels{LabelAPIKey: v}); err != nil {
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
