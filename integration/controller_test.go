//go:build integration

package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stores"
)

// TestControllerDeploys: the controller, packaged as
// packaging/kubernetes/controller and built by `make controller-image`,
// runs as a Deployment under runc on the test cluster, reaches the API
// server from its pod (it injects its webhook's CA bundle through it),
// and the API server calls its webhook at the pod's address: a pod naming
// a Checkpoint that does not exist is refused, with the name in the
// message. The E2B label guard is in force (the admin's pod with a
// sandbox label refused) and the controller says so; so is the guard of
// cryo.dev/runtime-class (a runc pod labelled cryo refused). Restart brings a new
// pod up that answers the same way.
func TestControllerDeploys(t *testing.T) {
	k := harness.StartK8s(t)
	c := k.StartController(t)

	if rc := k.MustKubectl("-n", harness.ControllerNamespace, "get", "pods", "-o", "jsonpath={.items[*].spec.runtimeClassName}"); rc != harness.RuncHandler {
		t.Fatalf("controller pods run under runtime classes %q, want %q", rc, harness.RuncHandler)
	}
	out := c.TryRestorePod("default", "restore-missing", "missing")
	if !strings.Contains(out, "denied") || !strings.Contains(out, `missing`) {
		t.Fatalf("a pod restoring from Checkpoint missing: %s\nwant a denial naming it", out)
	}
	t.Logf("the webhook's answer: %s", strings.TrimSpace(out))
	// The webhook calls only pods that ask for a restore: others pass
	// whatever the controller does.
	plain := harness.Pod("plain", nil, harness.Container("c", "sleep inf"))
	plain["spec"].(map[string]any)["runtimeClassName"] = harness.RuncHandler
	k.Apply(plain)
	if l := k.MustKubectl("get", "pod", "plain", "-o", "jsonpath={.metadata.labels}"); strings.Contains(l, "cryo.dev/runtime-class") {
		t.Errorf("a runc pod labelled %s", l)
	}
	k.MustKubectl("delete", "pod", "plain", "--wait=false")
	// Every cryo pod is labelled for the controller's cache, one with a
	// checkpoint target of its own too.
	for _, ann := range []map[string]string{nil, {"cryo.dev/checkpoint-to": harness.DefaultStore + "/default/mine:x"}} {
		var admitted struct {
			Metadata struct {
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		out := c.DryRun("default", harness.Pod("labelled", ann, harness.Container("c", "sleep inf")))
		if err := json.Unmarshal([]byte(out), &admitted); err != nil || admitted.Metadata.Labels["cryo.dev/runtime-class"] != "cryo" ||
			admitted.Metadata.Annotations["cryo.dev/checkpoint-to"] == "" {
			t.Errorf("a cryo pod with annotations %v, as admitted: %v\n%s\nwant the label cryo.dev/runtime-class=cryo and a checkpoint target", ann, err, out)
		}
	}

	// The E2B label guard came with the kustomization: the API server
	// refuses the sandbox label to anyone but the controller (here, the
	// test's admin), and the controller checked it before serving.
	sbx := harness.Pod("e2b-stolen-0", nil, harness.Container("c", "sleep inf"))
	sbx["metadata"].(map[string]any)["labels"] = map[string]any{"cryo.dev/e2b-sandbox": "stolen"}
	if out := c.DryRun("default", sbx); !strings.Contains(out, "cryo-e2b-labels") || !strings.Contains(out, "label cryo.dev/e2b-sandbox: reserved") {
		t.Errorf("a pod labelled with a sandbox id, created by the admin: %s\nwant the label guard's refusal", out)
	}
	// So did the guard of cryo.dev/runtime-class: a runc pod cannot claim
	// a cryo class to enter the controller's cache.
	forged := harness.Pod("forged", nil, harness.Container("c", "sleep inf"))
	forged["spec"].(map[string]any)["runtimeClassName"] = harness.RuncHandler
	forged["metadata"].(map[string]any)["labels"] = map[string]any{"cryo.dev/runtime-class": "cryo"}
	if out := c.DryRun("default", forged); !strings.Contains(out, "cryo-runtime-class-label") || !strings.Contains(out, "label cryo.dev/runtime-class: value 'cryo'") {
		t.Errorf("a runc pod labelled cryo.dev/runtime-class=cryo: %s\nwant the runtime-class label guard's refusal", out)
	}
	// kube-controller-manager type-checks each policy's expressions against
	// the kinds it matches (pods, Bindings, Checkpoints): a warning is an
	// expression that may fail at run time, and with failurePolicy Fail a
	// failure refuses every pod, or every scheduling.
	for _, pol := range []string{"cryo-e2b-labels", "cryo-runtime-class-label"} {
		var tc string
		if !harness.WaitFor(time.Minute, func() bool {
			tc = k.MustKubectl("get", "validatingadmissionpolicy", pol, "-o", "jsonpath={.status.typeChecking}")
			return tc != ""
		}) {
			t.Errorf("policy %s: not type-checked within a minute", pol)
		} else if strings.Contains(tc, "expressionWarnings") {
			t.Errorf("policy %s: type-checking warnings: %s", pol, tc)
		} else {
			t.Logf("policy %s: type-checked: %s", pol, tc)
		}
	}
	if log := c.Logs(); !strings.Contains(log, "e2b label guard in force") || !strings.Contains(log, "system:serviceaccount:"+harness.ControllerNamespace+":cryo-controller") {
		t.Errorf("the controller's log does not say the label guard is in force for its ServiceAccount:\n%s", log)
	}

	before := c.Pods()
	c.Restart()
	after := c.Pods()
	if len(after) != 1 || len(before) != 1 || after[0] == before[0] {
		t.Fatalf("controller pods before the restart %v, after %v: want one new pod", before, after)
	}
	if out := c.TryRestorePod("default", "restore-missing", "missing-after-restart"); !strings.Contains(out, "missing-after-restart") {
		t.Fatalf("after the restart, a pod restoring from a missing Checkpoint: %s", out)
	}
}

// TestClusterStore: the K8s Env's S3 store (versitygw in the node's
// network namespace) is reachable where the controller's tests need it:
// from a pod under runc at NodeIP, from the cryo shim (a checkpoint
// through the kubelet to the repository the controller's default store
// gives the namespace), and from the test (K8s.StoreOptions).
func TestClusterStore(t *testing.T) {
	k := harness.StartK8s(t)

	t.Run("a runc pod reaches it at NodeIP", func(t *testing.T) {
		k := k.T(t)
		p := harness.Pod("s3-client", nil, harness.Container("c", "sleep inf"))
		p["spec"].(map[string]any)["runtimeClassName"] = harness.RuncHandler
		k.Apply(p)
		k.WaitReady("s3-client", time.Now(), 2*time.Minute)
		// Anonymous: versitygw answers 403, which only it can.
		out, errs, _ := k.Kubectl("exec", "s3-client", "--", "wget", "-q", "-O-", "http://"+harness.S3Addr+"/"+harness.S3Bucket+"/")
		if !strings.Contains(out+errs, "403") {
			t.Fatalf("wget from a runc pod to %s: %s%s; want versitygw's 403", harness.S3Addr, out, errs)
		}
	})

	t.Run("the shim checkpoints to it", func(t *testing.T) {
		k := k.T(t)
		repo := harness.DefaultStore + "/default/pods"
		k.Apply(harness.Pod("s3-src", map[string]string{"cryo.dev/checkpoint-to": repo + ":pod-s3-src"}, harness.Container("c", "sleep inf")))
		k.WaitReady("s3-src", time.Now(), 3*time.Minute)
		if _, err := k.KubeletCheckpoint("default", "s3-src", "c"); err != nil {
			t.Fatal(err)
		}
		st, ref, err := stores.Open(t.Context(), repo+":pod-s3-src", k.StoreOptions())
		if err != nil {
			t.Fatal(err)
		}
		d, err := st.Resolve(t.Context(), ref)
		if err != nil {
			t.Fatalf("resolve %s:%s after the kubelet's checkpoint: %v", repo, ref, err)
		}
		t.Logf("%s:%s is %s (%d bytes)", repo, ref, d.Digest, d.Size)
		deleteAndCheck(t, k, "s3-src")
	})
}
