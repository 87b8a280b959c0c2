package e2bapi

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestLimits: oversized bodies, metadata and env vars, and every field
// or route cryo does not honour are refused in E2B's error shape with a
// message naming the field, and create nothing.
func TestLimits(t *testing.T) {
	f := newFixture(t)
	id := f.create("key-a", `{}`)
	many := func(n int, kv func(i int) string) string {
		var parts []string
		for i := range n {
			parts = append(parts, kv(i))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	big := `{"metadata":{"k":"` + strings.Repeat("x", maxBody) + `"}}`
	for _, c := range []struct {
		method, path, body string
		code               int
		field              string
	}{
		{"POST", "/v2/sandboxes", big, http.StatusRequestEntityTooLarge, "request body"},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":` + strings.Repeat("1", maxBody) + `}`, http.StatusRequestEntityTooLarge, "request body"},
		{"POST", "/v2/sandboxes", `{"metadata":` + many(maxMetadata+1, func(i int) string { return fmt.Sprintf(`"k%d":"v"`, i) }) + `}`, 400, "metadata"},
		{"POST", "/v2/sandboxes", `{"metadata":{"` + strings.Repeat("k", maxMetadataKey+1) + `":"v"}}`, 400, "metadata"},
		{"POST", "/v2/sandboxes", `{"metadata":{"":"v"}}`, 400, "metadata"},
		{"POST", "/v2/sandboxes", `{"metadata":{"k":"` + strings.Repeat("v", maxMetadataValue+1) + `"}}`, 400, "metadata"},
		{"POST", "/v2/sandboxes", `{"envVars":` + many(maxEnvVars+1, func(i int) string { return fmt.Sprintf(`"K%d":"v"`, i) }) + `}`, 400, "envVars"},
		{"POST", "/v2/sandboxes", `{"envVars":{"A=B":"v"}}`, 400, "envVars"},
		{"POST", "/v2/sandboxes", `{"envVars":{"1A":"v"}}`, 400, "envVars"},
		{"POST", "/v2/sandboxes", `{"envVars":{"A":"` + strings.Repeat("v", maxEnvBytes) + `"}}`, 400, "envVars"},
		{"POST", "/v2/sandboxes", `{"network":{"denyOut":["0.0.0.0/0"]}}`, 400, "network"},
		{"POST", "/v2/sandboxes", `{"allow_internet_access":false}`, 400, "allow_internet_access"},
		{"POST", "/v2/sandboxes", `{"iam":{"tokens":{"t":{"audience":"a","tokenType":"x"}}}}`, 400, "iam"},
		{"POST", "/v2/sandboxes", `{"autoPause":true,"autoPauseMemory":false}`, 400, "autoPauseMemory"},
		{"POST", "/v2/sandboxes", `{"volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volumeMounts"},
		{"POST", "/v2/sandboxes", `{"mcp":{"x":{}}}`, 400, "mcp"},
		{"PUT", "/sandboxes/" + id + "/network", `{"allowOut":["1.1.1.1"]}`, 400, "network"},
		{"POST", "/v3/templates", `{"name":"t"}`, 404, "template builds"},
		{"POST", "/v2/templates/t/builds/b", `{}`, 404, "template builds"},
		{"GET", "/templates/t/builds/b/status", "", 404, "template builds"},
		{"GET", "/templates/aliases/base", "", 404, "template builds"},
		{"GET", "/templates/t/files/abc", "", 404, "template builds"},
		{"POST", "/volumes", `{"name":"v"}`, 404, "volumes"},
		{"GET", "/volumes/v", "", 404, "volumes"},
		{"POST", "/secrets", `{"name":"s","value":"v"}`, 404, "secrets"},
	} {
		var e apiError
		code := f.do("key-a", c.method, c.path, c.body, &e)
		if code != c.code || e.Code != code || !strings.HasPrefix(e.Message, c.field) {
			msg := e.Message
			if len(msg) > 120 {
				msg = msg[:120]
			}
			t.Errorf("%s %s (%d bytes): %d %q, want %d naming %s", c.method, c.path, len(c.body), code, msg, c.code, c.field)
		}
	}
	var list []listedBody
	if code := f.do("key-a", "GET", "/v2/sandboxes", "", &list); code != 200 || len(list) != 1 {
		t.Errorf("sandboxes after the refusals: %d %d, want the first only", code, len(list))
	}
	// At the bounds, accepted.
	f.create("key-a", `{"metadata":`+many(maxMetadata, func(i int) string { return fmt.Sprintf(`"k%d":"%s"`, i, strings.Repeat("v", maxMetadataValue)) })+
		`,"envVars":{"_A.b-1":"v"},"allow_internet_access":true,"autoPauseMemory":true,"network":null,"secure":true}`)
}
