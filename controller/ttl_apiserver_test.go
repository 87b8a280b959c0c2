package controller

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// TestTTLAsTheAPIServerSeesIt creates (dry run) Checkpoints with the
// packaged CRD in a real API server: its schema (pattern and CEL rule) must
// admit exactly the ttlAfterFinished values ParseTTL accepts, since the spec
// is immutable and a Checkpoint the API admitted with a TTL the controller
// refuses could only fail InvalidSpec and be recreated.
func TestTTLAsTheAPIServerSeesIt(t *testing.T) {
	c := apiServer(t)
	for _, ttl := range []string{
		// Accepted: Go durations (its whole grammar: sign, fractions, both
		// micro signs), whole days alone, up to 3650d.
		"30s", "5m", "2h", "1h30m", "90m", "1h0m0s", "1000ms", "2µs", "2μs", "1us", "5ns", "0.5s", "1.5h", ".5h", "1.h",
		"+1h", "3d", "7d", "007d", "+5d", "3650d", "87600h", "315360000s", "87599h59m59.999999999s",
		// Refused: compound or fractional days, zero, beyond ten years,
		// negative, other grammars, overflow.
		"1d12h", "12h1d", "1.5d", "0s", "0", "0d", "0h0m", "-0s", "9999d", "3651d", "87600h1ns", "87601h", "315360001s",
		"-1h", "-5d", "+-1h", "++1h", "1 week", "1w", "d", "h", ".h", ".d", "1", "1e3s", "1h-5m", "1H", "5m ", " 5m", "1.5.5h",
		"99999999999h", "9999999999999999999999d", "99999999999999999999ns",
	} {
		_, perr := ParseTTL(ttl)
		cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ttl"},
			Spec: cryov1.CheckpointSpec{PodName: "p", TTLAfterFinished: ttl}}
		err := c.Create(context.Background(), cp, client.DryRunAll)
		switch {
		case perr == nil && err != nil:
			t.Errorf("ttlAfterFinished %q: ParseTTL accepts it, the API refuses it: %v", ttl, err)
		case perr != nil && err == nil:
			t.Errorf("ttlAfterFinished %q: ParseTTL refuses it (%v), the API admits it", ttl, perr)
		case err != nil && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.ttlAfterFinished")):
			t.Errorf("ttlAfterFinished %q: %v, want Invalid naming spec.ttlAfterFinished", ttl, err)
		}
	}
	// The bounds' message, and a value outside the grammar refused by the
	// pattern alone (the rule leaves it to it).
	for ttl, want := range map[string]string{
		"9999d":  "spec.ttlAfterFinished must be more than zero and at most 3650d (87600h)",
		"0s":     "spec.ttlAfterFinished must be more than zero and at most 3650d (87600h)",
		"1d12h":  "spec.ttlAfterFinished in body should match",
		"1 week": "spec.ttlAfterFinished in body should match",
	} {
		cp := &cryov1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ttl"},
			Spec: cryov1.CheckpointSpec{PodName: "p", TTLAfterFinished: ttl}}
		err := c.Create(context.Background(), cp, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ttlAfterFinished %q: %v, want %q", ttl, err, want)
		}
		if err != nil && strings.Count(err.Error(), "spec.ttlAfterFinished:") != 1 {
			t.Errorf("ttlAfterFinished %q: %v, want one error", ttl, err)
		}
	}
}
