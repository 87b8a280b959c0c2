package envd

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// GET and POST /files: download and upload, as E2B's envd serves them to
// the SDK's files.read and files.write. The SDK's signed URLs (downloadUrl,
// uploadUrl) reach these without the access token header.

// Signing operations: the SDK signs a download URL as "read" and an upload
// URL as "write".
const (
	signRead  = "read"
	signWrite = "write"
)

// maxPartHeader bounds a multipart part's header, well below
// mime/multipart's own 10 MiB: the SDK sends a Content-Disposition with a
// path and a Content-Type.
const maxPartHeader = 64 << 10

// filesPath is the only path reachable with a signed URL instead of the
// access token header.
const filesPath = "/files"

// writtenEntry is one element of the JSON list an upload answers, the
// fields the SDK's files.write returns.
type writtenEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// signedFilesRequest says whether r may skip the token header: a /files
// request that carries the SDK's signature, which the handler verifies.
func signedFilesRequest(r *http.Request) bool {
	return r.URL.Path == filesPath && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.Header.Get("X-Access-Token") == "" && r.URL.Query().Has("signature")
}

// filesAllowed checks a /files request: the access token header, else the
// SDK's signature: "v1_" and the unpadded base64 SHA-256 of
// "path:operation:username:token[:expiration]". The plain token is known
// only after /init, so a signed URL is refused before.
func (s *Server) filesAllowed(r *http.Request, op string) error {
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if !s.tokenMatches(h) {
			return errors.New("invalid access token")
		}
		return nil
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errors.New("missing access token or signature")
	}
	s.mu.Lock()
	token := s.token
	s.mu.Unlock()
	if token == "" {
		return errors.New("a signed URL needs envd initialized (/init)")
	}
	fields := []string{q.Get("path"), op, q.Get("username"), token}
	var expires int64
	if v := q.Get("signature_expiration"); v != "" {
		var err error
		if expires, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("signature_expiration: %w", err)
		}
		fields = append(fields, strconv.FormatInt(expires, 10))
	}
	sum := sha256.Sum256([]byte(strings.Join(fields, ":")))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errors.New("invalid signature")
	}
	if expires != 0 && expires < time.Now().Unix() {
		return errors.New("signature is expired")
	}
	return nil
}

// filesRequest authorizes a /files request and resolves its user and path.
// It answers the error itself and returns nil then.
func (s *Server) filesRequest(w http.ResponseWriter, r *http.Request, op string) (*fsRequest, string) {
	if err := s.filesAllowed(r, op); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil, ""
	}
	q := r.URL.Query()
	fr, err := s.fsRequestFor(q.Get("username"))
	if err != nil {
		writeError(w, filesStatus(err), err.Error())
		return nil, ""
	}
	p, err := fr.path(q.Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, ""
	}
	return fr, p
}

// filesStatus is the HTTP status of a files error. A full disk is 507, as
// E2B's envd answers an upload, where its RPCs say Internal.
func filesStatus(err error) int {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return http.StatusInsufficientStorage
	}
	var ce *connect.Error
	if !errors.As(fsError(err), &ce) {
		return http.StatusInternalServerError
	}
	switch ce.Code() {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeInvalidArgument, connect.CodeAlreadyExists:
		return http.StatusBadRequest
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// download serves a regular file of the container. O_NONBLOCK keeps a FIFO
// the container put there from hanging the request; anything but a regular
// file is refused.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	fr, p := s.filesRequest(w, r, signRead)
	if fr == nil {
		return
	}
	f, err := fr.open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", p))
			return
		}
		writeError(w, filesStatus(err), err.Error())
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is not a regular file", p))
		return
	}
	// as E2B's envd: the SDK's downloadUrl opened in a browser shows or
	// saves the file under its name, its type from that name (or, plain,
	// from its content)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Vary", "Accept-Encoding")
	if acceptsGzip(r) {
		w.Header().Set("Content-Type", gzipContentType(p))
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		if _, err := io.Copy(gz, f); err != nil {
			log.G(r.Context()).WithError(err).Warn("envd: gzip download")
		}
		gz.Close()
		return
	}
	http.ServeContent(w, r, p, fi.ModTime(), f)
}

// gzipContentType is the type of a gzip download, whose content
// ServeContent cannot sniff: the name's, else octet-stream.
func gzipContentType(p string) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// acceptsGzip: the SDK's files.read({gzip: true}) asks for a gzip body. A
// range or conditional request gets the plain file, whose ranges and
// validators ServeContent handles.
func acceptsGzip(r *http.Request) bool {
	for _, h := range []string{"Range", "If-Range", "If-Modified-Since", "If-None-Match"} {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

// upload writes the body's files: an application/octet-stream body to
// ?path (the SDK with envd ≥ 0.5.7 for streams and gzip), or multipart
// "file" parts, each to ?path or else to its own filename (the SDK's
// writeFiles). Every file streams to disk.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	fr, p := s.filesRequest(w, r, signWrite)
	if fr == nil {
		return
	}
	body, err := decodedBody(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []writtenEntry
	switch {
	case mediaType == "application/octet-stream":
		if r.URL.Query().Get("path") == "" {
			writeError(w, http.StatusBadRequest, "path query parameter is required for an octet-stream upload")
			return
		}
		if err := fr.writeFile(p, body); err != nil {
			writeError(w, filesStatus(err), err.Error())
			return
		}
		written = []writtenEntry{{Name: path.Base(p), Type: "file", Path: p}}
	case strings.HasPrefix(mediaType, "multipart/") && params["boundary"] != "":
		var status int
		budget := &headerBudget{r: body}
		written, status, err = fr.writeParts(multipart.NewReader(budget, params["boundary"]), budget, r.URL.Query())
		if err != nil {
			writeError(w, status, err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported content type %q: want multipart/form-data or application/octet-stream", r.Header.Get("Content-Type")))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

// decodedBody undoes the SDK's Content-Encoding: gzip (files.write with
// gzip: true).
func decodedBody(r *http.Request) (io.Reader, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return r.Body, nil
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, fmt.Errorf("gzip body: %w", err)
		}
		return gz, nil
	default:
		return nil, fmt.Errorf("unsupported Content-Encoding %q", enc)
	}
}

// headerBudget limits what a multipart reader reads while it looks for the
// next part's header (the reader's read-ahead, a few KiB, is well within).
type headerBudget struct {
	r       io.Reader
	limited bool
	left    int
}

var errPartHeader = fmt.Errorf("a part's header is over %d bytes", maxPartHeader)

func (b *headerBudget) Read(p []byte) (int, error) {
	if !b.limited {
		return b.r.Read(p)
	}
	if b.left <= 0 {
		return 0, errPartHeader
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= n
	return n, err
}

// nextPart is mr.NextPart with the header bounded by budget.
func nextPart(mr *multipart.Reader, budget *headerBudget) (*multipart.Part, error) {
	budget.limited, budget.left = true, maxPartHeader
	defer func() { budget.limited = false }()
	return mr.NextPart()
}

// writeParts writes each "file" part, its body streamed to its file.
func (fr *fsRequest) writeParts(mr *multipart.Reader, budget *headerBudget, q url.Values) ([]writtenEntry, int, error) {
	written := []writtenEntry{}
	seen := map[string]bool{}
	for {
		part, err := nextPart(mr, budget)
		if err == io.EOF {
			return written, http.StatusOK, nil
		}
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("multipart body: %w", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := q.Get("path")
		if target == "" {
			target = partFilename(part)
		}
		p, err := fr.path(target)
		if err != nil {
			return nil, http.StatusBadRequest, err
		}
		if seen[p] {
			return nil, http.StatusBadRequest, fmt.Errorf("cannot upload more than one file to '%s' in one request", p)
		}
		seen[p] = true
		err = fr.writeFile(p, part)
		part.Close()
		if err != nil {
			return nil, filesStatus(err), err
		}
		written = append(written, writtenEntry{Name: path.Base(p), Type: "file", Path: p})
	}
}

// partFilename is a part's filename as sent, a path: multipart.Part's
// FileName keeps only its base.
func partFilename(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeFile streams src to the regular file p, creating it and its parents
// owned by the user (an existing file is taken over too, as E2B's envd
// does). O_NONBLOCK keeps a FIFO at p from hanging the request.
func (fr *fsRequest) writeFile(p string, src io.Reader) error {
	if err := fr.ensureDirs(path.Dir(p)); err != nil {
		return err
	}
	f, err := fr.open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NONBLOCK, newFileMode)
	if err != nil {
		if errors.Is(err, unix.EISDIR) {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is a directory: %s", p))
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is not a regular file: %s", p))
	}
	if err := f.Chown(int(fr.user.UID), int(fr.user.GID)); err != nil {
		return err
	}
	if _, err := io.Copy(f, src); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("write %s: %w", p, pe.Err)
		}
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("read the body of %s: %w", p, err))
	}
	return f.Close()
}
