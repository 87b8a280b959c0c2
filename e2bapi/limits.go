package e2bapi

import (
	"net/http"
	"regexp"
)

// Bounds on what a request may store in the cluster. Metadata and env
// vars end up in a pod's annotations (at most 256 KiB in all, Kubernetes
// refuses more) and env vars also in its spec: these keep a sandbox well
// inside that, with room for a Checkpoint's copy.
const (
	maxBody          = 1 << 20 // bytes of any request body
	maxMetadata      = 64
	maxMetadataKey   = 63
	maxMetadataValue = 512
	maxEnvVars       = 128
	maxEnvName       = 256
	maxEnvBytes      = 64 << 10 // names and values together
	maxForks         = 16
)

// envName is Kubernetes' rule for a container's environment variable
// name (before 1.34 relaxed it): the pod's creation would fail on others.
var envName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

func validMetadata(m map[string]string) error {
	if len(m) > maxMetadata {
		return errf(http.StatusBadRequest, "metadata: %d entries, at most %d", len(m), maxMetadata)
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetadataKey {
			return errf(http.StatusBadRequest, "metadata: key %.80q is empty or longer than %d bytes", k, maxMetadataKey)
		}
		if len(v) > maxMetadataValue {
			return errf(http.StatusBadRequest, "metadata: the value of %q is longer than %d bytes", k, maxMetadataValue)
		}
	}
	return nil
}

func validEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return errf(http.StatusBadRequest, "envVars: %d variables, at most %d", len(env), maxEnvVars)
	}
	total := 0
	for k, v := range env {
		if len(k) > maxEnvName || !envName.MatchString(k) {
			return errf(http.StatusBadRequest, "envVars: %.80q is not a valid variable name (letters, digits, '_', '-', '.', not starting with a digit, at most %d bytes)", k, maxEnvName)
		}
		total += len(k) + len(v)
	}
	if total > maxEnvBytes {
		return errf(http.StatusBadRequest, "envVars: %d bytes of names and values, at most %d", total, maxEnvBytes)
	}
	return nil
}

// validate refuses what cryo cannot honour, naming the field, rather
// than create a sandbox that silently lacks it.
func (b *createBody) validate() error {
	switch {
	case len(b.VolumeMounts) > 0:
		return errf(http.StatusBadRequest, "volumeMounts: volumes are not supported by cryo's E2B API")
	case set(b.MCP):
		return errf(http.StatusBadRequest, "mcp: not supported by cryo's E2B API")
	case set(b.Network):
		return errf(http.StatusBadRequest, "network: egress rules are not supported by cryo's E2B API (use a NetworkPolicy on the namespace)")
	case b.AllowInternetAccess != nil && !*b.AllowInternetAccess:
		return errf(http.StatusBadRequest, "allow_internet_access: false is not supported by cryo's E2B API (use a NetworkPolicy on the namespace)")
	case set(b.IAM):
		return errf(http.StatusBadRequest, "iam: workload identity tokens are not supported by cryo's E2B API")
	case b.AutoPauseMemory != nil && !*b.AutoPauseMemory:
		return errf(http.StatusBadRequest, "autoPauseMemory: false is not supported: cryo always keeps the memory")
	}
	if err := validMetadata(b.Metadata); err != nil {
		return err
	}
	return validEnv(b.EnvVars)
}

// set is whether an optional JSON object or array field carries anything.
func set(raw []byte) bool {
	switch string(raw) {
	case "", "null", "{}", "[]":
		return false
	}
	return true
}
