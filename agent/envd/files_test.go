package envd

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// filesURL is the SDK's fileUrl: /files?path=..&username=.. (each only when
// set).
func (e *fsEnv) filesURL(path, user string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if user != "" {
		q.Set("username", user)
	}
	return e.ts.URL + "/files?" + q.Encode()
}

// sign adds the signature the SDK's downloadUrl and uploadUrl compute
// (src/sandbox/signature.ts): "v1_" and the unpadded base64 of the SHA-256
// of path:operation:user:token[:expiration].
func signURL(u, path, op, user, token string, expires int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expires != 0 {
		raw += ":" + strconv.FormatInt(expires, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	u += "&signature=" + url.QueryEscape("v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	if expires != 0 {
		u += "&signature_expiration=" + strconv.FormatInt(expires, 10)
	}
	return u
}

// do sends a request with the token header when token is set, and returns
// the status and body.
func filesDo(t *testing.T, method, u, token, contentType string, body io.Reader, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	r, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("X-Access-Token", token)
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultTransport.RoundTrip(r) // no transparent gzip
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// multipartBody is what the SDK's files.write sends: one "file" part per
// file, named by its path.
func multipartBody(t *testing.T, files ...string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		w, err := mw.CreateFormFile("file", files[i])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(files[i+1]))
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func writtenEntries(t *testing.T, b []byte) []writtenEntry {
	t.Helper()
	var out []writtenEntry
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("upload answer %s: %v", b, err)
	}
	return out
}

func TestUploadMultipart(t *testing.T) {
	e := newFSEnv(t)
	// files.write(path, data): ?path and the part named by it.
	ct, body := multipartBody(t, "dir/one.txt", "one")
	code, b, _ := filesDo(t, "POST", e.filesURL("dir/one.txt", "user"), fsToken, ct, body)
	if code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, b)
	}
	if w := writtenEntries(t, b); len(w) != 1 || w[0] != (writtenEntry{Name: "one.txt", Type: "file", Path: "/home/user/dir/one.txt"}) {
		t.Fatalf("upload answered %+v", w)
	}
	// files.write([...]): no ?path, each part to its own path.
	ct, body = multipartBody(t, "/abs/a", "A", "rel/b", "B")
	code, b, _ = filesDo(t, "POST", e.filesURL("", "user"), fsToken, ct, body)
	if code != http.StatusOK || len(writtenEntries(t, b)) != 2 {
		t.Fatalf("writeFiles: %d %s", code, b)
	}
	for p, want := range map[string]string{"/home/user/dir/one.txt": "one", "/abs/a": "A", "/home/user/rel/b": "B"} {
		if got, err := os.ReadFile(e.host(p)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
		for _, q := range []string{p, filepath.Dir(p)} {
			if uid, gid := ownerOf(t, e.host(q)); uid != 1000 || gid != 1000 {
				t.Errorf("%s owned by %d:%d, want the user's", q, uid, gid)
			}
		}
	}
	// Two parts to one path is refused, as E2B's envd.
	ct, body = multipartBody(t, "x", "1", "x", "2")
	if code, b, _ := filesDo(t, "POST", e.filesURL("", "user"), fsToken, ct, body); code != http.StatusBadRequest {
		t.Fatalf("two parts to one path: %d %s", code, b)
	}
	// A part's header is bounded.
	huge := "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"h\"\r\nX-Pad: " + strings.Repeat("p", 100<<10) + "\r\n\r\ndata\r\n--b--\r\n"
	if code, b, _ := filesDo(t, "POST", e.filesURL("", "user"), fsToken, "multipart/form-data; boundary=b", strings.NewReader(huge)); code != http.StatusBadRequest || !strings.Contains(string(b), "header") {
		t.Fatalf("a 100 KiB part header: %d %s", code, b)
	}
	if _, err := os.Stat(e.host("/home/user/h")); err == nil {
		t.Fatal("a part with a 100 KiB header was written")
	}
	// A directory is not overwritten.
	ct, body = multipartBody(t, "dir", "x")
	if code, b, _ := filesDo(t, "POST", e.filesURL("dir", "user"), fsToken, ct, body); code != http.StatusBadRequest {
		t.Fatalf("upload onto a directory: %d %s", code, b)
	}
}

func TestUploadOctetStream(t *testing.T) {
	e := newFSEnv(t)
	big := strings.Repeat("0123456789", 100000)
	code, b, _ := filesDo(t, "POST", e.filesURL("/data/big", ""), fsToken, "application/octet-stream", strings.NewReader(big))
	if code != http.StatusOK || writtenEntries(t, b)[0].Path != "/data/big" {
		t.Fatalf("octet-stream upload: %d %s", code, b)
	}
	if got, _ := os.ReadFile(e.host("/data/big")); string(got) != big {
		t.Fatalf("uploaded %d bytes, want %d", len(got), len(big))
	}
	// files.write(.., {gzip: true}).
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()
	code, b, _ = filesDo(t, "POST", e.filesURL("z", "user"), fsToken, "application/octet-stream", &gz, "Content-Encoding", "gzip")
	if code != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", code, b)
	}
	if got, _ := os.ReadFile(e.host("/home/user/z")); string(got) != "zipped" {
		t.Fatalf("gzip upload wrote %q", got)
	}
	if uid, _ := ownerOf(t, e.host("/home/user/z")); uid != 1000 {
		t.Fatalf("gzip upload owned by %d", uid)
	}
	if code, _, _ := filesDo(t, "POST", e.filesURL("", ""), fsToken, "application/octet-stream", strings.NewReader("x")); code != http.StatusBadRequest {
		t.Fatalf("octet-stream without a path: %d", code)
	}
	if code, _, _ := filesDo(t, "POST", e.filesURL("x", ""), fsToken, "text/plain", strings.NewReader("x")); code != http.StatusBadRequest {
		t.Fatalf("text/plain upload: %d", code)
	}
}

// An upload through a symlink to a host path writes inside the root.
func TestUploadStaysInRoot(t *testing.T) {
	e := newFSEnv(t)
	outside := t.TempDir()
	writeHostFile(t, filepath.Join(outside, "target"), "host")
	symlinkHost(t, filepath.Join(outside, "target"), e.host("/home/user/link"))
	mkdirOwned(t, e.host(outside), 0, 0)
	code, b, _ := filesDo(t, "POST", e.filesURL("link", "user"), fsToken, "application/octet-stream", strings.NewReader("guest"))
	if code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, b)
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "target")); string(got) != "host" {
		t.Fatalf("the host's file was written: %q", got)
	}
	if got, _ := os.ReadFile(e.host(filepath.Join(outside, "target"))); string(got) != "guest" {
		t.Fatalf("the container's file holds %q", got)
	}
}

func TestDownload(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/home/user/f"), "content")
	// The container's /etc/passwd, not the host's, through a symlink.
	symlinkHost(t, "/etc/passwd", e.host("/home/user/pw"))
	code, b, h := filesDo(t, "GET", e.filesURL("f", "user"), fsToken, "", nil)
	if code != http.StatusOK || string(b) != "content" {
		t.Fatalf("download: %d %q %v", code, b, h)
	}
	code, b, _ = filesDo(t, "GET", e.filesURL("/home/user/pw", ""), fsToken, "", nil)
	if want, _ := os.ReadFile(e.host("/etc/passwd")); code != http.StatusOK || string(b) != string(want) {
		t.Fatalf("download through a symlink to /etc/passwd: %d %q", code, b)
	}
	code, b, h = filesDo(t, "GET", e.filesURL("f", "user"), fsToken, "", nil, "Accept-Encoding", "gzip")
	if code != http.StatusOK || h.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %d %v", code, h)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	} else if got, _ := io.ReadAll(zr); string(got) != "content" {
		t.Fatalf("gzip download: %q", got)
	}
	code, b, _ = filesDo(t, "GET", e.filesURL("f", "user"), fsToken, "", nil, "Range", "bytes=1-3")
	if code != http.StatusPartialContent || string(b) != "ont" {
		t.Fatalf("range download: %d %q", code, b)
	}

	code, b, _ = filesDo(t, "GET", e.filesURL("/nope", ""), fsToken, "", nil)
	var msg struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &msg); code != http.StatusNotFound || err != nil || msg.Code != 404 || !strings.Contains(msg.Message, "/nope") {
		t.Fatalf("download of a missing file: %d %s", code, b)
	}
	if code, b, _ := filesDo(t, "GET", e.filesURL("/home", ""), fsToken, "", nil); code != http.StatusBadRequest {
		t.Fatalf("download of a directory: %d %s", code, b)
	}
	if code, b, _ := filesDo(t, "GET", e.filesURL("f", "nobody"), fsToken, "", nil); code != http.StatusUnauthorized || !strings.Contains(string(b), "nobody") {
		t.Fatalf("download as an unknown user: %d %s", code, b)
	}
}

// TestDownloadHeaders: as E2B's envd, a download is inline under its base
// name, its type from the name or else sniffed; a gzip one's from the name
// or else octet-stream.
func TestDownloadHeaders(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/home/user/d/data.json"), `{"a":1}`)
	writeHostFile(t, e.host("/home/user/notes"), "plain text")
	writeHostFile(t, e.host("/home/user/my file"), "x")
	for _, c := range []struct{ path, encoding, disposition, contentType string }{
		{"d/data.json", "identity", "inline; filename=data.json", "application/json"},
		{"d/data.json", "gzip", "inline; filename=data.json", "application/json"},
		{"notes", "identity", "inline; filename=notes", "text/plain; charset=utf-8"},
		{"notes", "gzip", "inline; filename=notes", "application/octet-stream"},
		{"my file", "identity", `inline; filename="my file"`, "text/plain; charset=utf-8"},
	} {
		code, _, h := filesDo(t, "GET", e.filesURL(c.path, "user"), fsToken, "", nil, "Accept-Encoding", c.encoding)
		if code != http.StatusOK || h.Get("Content-Disposition") != c.disposition || h.Get("Content-Type") != c.contentType {
			t.Errorf("download %q (%q): %d, Content-Disposition %q and Content-Type %q, want %q and %q",
				c.path, c.encoding, code, h.Get("Content-Disposition"), h.Get("Content-Type"), c.disposition, c.contentType)
		}
	}
}

func TestFilesAuth(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/home/user/f"), "content")
	get := func(u string, token string) int {
		code, _, _ := filesDo(t, "GET", u, token, "", nil)
		return code
	}
	read := e.filesURL("f", "user")
	if code := get(read, ""); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d", code)
	}
	if code := get(read, "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d", code)
	}
	if code := get(signURL(read, "f", "read", "user", fsToken, 0), ""); code != http.StatusUnauthorized {
		t.Fatalf("a signature before /init: %d", code)
	}
	initEnvd(t, e.ts.URL+"/init", `{"accessToken":"secret"}`)

	future, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	for name, tc := range map[string]struct {
		url  string
		want int
	}{
		"signed":                    {signURL(read, "f", "read", "user", fsToken, 0), http.StatusOK},
		"signed, unexpired":         {signURL(read, "f", "read", "user", fsToken, future), http.StatusOK},
		"signed, expired":           {signURL(read, "f", "read", "user", fsToken, past), http.StatusUnauthorized},
		"signed with a wrong token": {signURL(read, "f", "read", "user", "wrong", 0), http.StatusUnauthorized},
		"signed for writing":        {signURL(read, "f", "write", "user", fsToken, 0), http.StatusUnauthorized},
		"signed for another path":   {signURL(read, "g", "read", "user", fsToken, 0), http.StatusUnauthorized},
		"signed for another user":   {signURL(read, "f", "read", "", fsToken, 0), http.StatusUnauthorized},
		"expiration moved":          {strings.Replace(signURL(read, "f", "read", "user", fsToken, past), strconv.FormatInt(past, 10), strconv.FormatInt(future, 10), 1), http.StatusUnauthorized},
		"no signature":              {read + "&signature=", http.StatusUnauthorized},
	} {
		if code := get(tc.url, ""); code != tc.want {
			t.Errorf("%s: %d, want %d", name, code, tc.want)
		}
	}
	// A signed upload (the SDK's uploadUrl, multipart).
	up := signURL(e.filesURL("up", ""), "up", "write", "", fsToken, future)
	ct, body := multipartBody(t, "up", "signed")
	if code, b, _ := filesDo(t, "POST", up, "", ct, body); code != http.StatusOK {
		t.Fatalf("signed upload: %d %s", code, b)
	}
	// A signature opens /files only.
	if code, _, _ := filesDo(t, "POST", signURL(e.ts.URL+"/filesystem.Filesystem/Stat?path=", "", "read", "", fsToken, 0), "", "application/json", strings.NewReader("{}")); code != http.StatusUnauthorized {
		t.Fatalf("a signature on an RPC: %d", code)
	}
}
