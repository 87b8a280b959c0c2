package envd

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type dirContainer string

func (d dirContainer) Root() (string, error) { return string(d), nil }

func newTestServer(t *testing.T, token string) (*Server, *httptest.Server) {
	t.Helper()
	s := New(dirContainer(t.TempDir()), sha256.Sum256([]byte(token)))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func TestParseTokenHash(t *testing.T) {
	sum := sha256.Sum256([]byte("t"))
	good := hex.EncodeToString(sum[:])
	if h, err := ParseTokenHash(good); err != nil || h != sum {
		t.Fatalf("ParseTokenHash(%q) = %x, %v", good, h, err)
	}
	for _, bad := range []string{"", good[:63], strings.ToUpper(good), good[:63] + "g"} {
		if _, err := ParseTokenHash(bad); err == nil {
			t.Errorf("ParseTokenHash(%q) accepted", bad)
		}
	}
}

func TestHealthAndInit(t *testing.T) {
	s, ts := newTestServer(t, "secret")
	resp, err := http.Get(ts.URL + "/health")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("GET /health: %v %v", resp, err)
	}
	post := func(body string) int {
		resp, err := http.Post(ts.URL+"/init", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"accessToken":"wrong"}`); code != http.StatusUnauthorized {
		t.Fatalf("init with a wrong token: %d, want 401", code)
	}
	if s.token != "" {
		t.Fatal("a wrong token was kept")
	}
	if code := post(`{"accessToken":"secret","envVars":{"A":"1"},"defaultUser":"user"}`); code != http.StatusNoContent {
		t.Fatalf("init: %d, want 204", code)
	}
	if s.token != "secret" || s.defaults["A"] != "1" || s.user != "user" {
		t.Fatalf("init kept token %q defaults %v user %q", s.token, s.defaults, s.user)
	}
}

func TestRoutesWantToken(t *testing.T) {
	_, ts := newTestServer(t, "secret")
	for _, tok := range []string{"", "wrong"} {
		req, _ := http.NewRequest("POST", ts.URL+"/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("X-Access-Token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, resp.StatusCode)
		}
	}
}

// TestCORS: a browser's preflight, which carries no token, is answered
// for any origin, and an answer carries the CORS headers, as E2B's envd
// does; the request itself still needs the token.
func TestCORS(t *testing.T) {
	_, ts := newTestServer(t, "secret")
	do := func(method, path string, h map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	pre := do("OPTIONS", "/process.Process/Start", map[string]string{
		"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "x-access-token,connect-protocol-version,content-type",
	})
	if pre.StatusCode >= 300 || pre.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(strings.ToLower(pre.Header.Get("Access-Control-Allow-Headers")), "x-access-token") {
		t.Errorf("preflight: %d %v, want it allowed for any origin and header", pre.StatusCode, pre.Header)
	}
	denied := do("GET", "/files?path=/x", map[string]string{"Origin": "https://app.example"})
	if denied.StatusCode != http.StatusUnauthorized || denied.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("GET /files without a token from a browser: %d, ACAO %q; want 401 that the page can read", denied.StatusCode, denied.Header.Get("Access-Control-Allow-Origin"))
	}
	ok := do("GET", "/health", map[string]string{"Origin": "https://app.example"})
	if exp := ok.Header.Get("Access-Control-Expose-Headers"); ok.StatusCode != http.StatusNoContent || !strings.Contains(exp, "Grpc-Status") {
		t.Errorf("GET /health from a browser: %d, exposed headers %q; want the Connect protocol's exposed", ok.StatusCode, exp)
	}
}
