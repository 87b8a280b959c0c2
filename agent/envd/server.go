package envd

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/cryo-runtime/cryo/agent/envd/spec/filesystem/filesystemconnect"
	"github.com/cryo-runtime/cryo/internal/envdweb"
)

// Port is where E2B's SDK expects envd.
const Port = envdweb.Port

// Annotation turns envd on for a pod: the lowercase hex SHA-256 of its
// access token (see ParseTokenHash). The node's annotations package knows
// the same key.
const Annotation = "cryo.dev/envd-access-token-sha256"

// maxInitBody bounds /init's JSON: a token, a default user and workdir and
// the sandbox's env vars.
const maxInitBody = 1 << 20

// maxRPCMessage bounds a Connect request message: paths and ids.
const maxRPCMessage = 1 << 20

// Container is the one container whose processes and files envd serves.
type Container interface {
	// Root is the container's root directory as the agent reaches it
	// (/proc/<init pid>/root): paths under it resolve in the container's
	// own mount namespace.
	Root() (string, error)
	// Process is how the container's own process runs: its user is the
	// default of a request that names none, its environment the base of
	// every process envd starts.
	Process() ProcessSpec
	// Spawn starts cmd inside the container (its namespaces, root and
	// cgroup) with cmd's credentials. The process outlives ctx, which
	// bounds the start only.
	Spawn(ctx context.Context, cmd Command) (Process, error)
}

// Server serves envd for one container.
type Server struct {
	container Container
	tokenHash [sha256.Size]byte
	processes *processService

	mu       sync.Mutex
	token    string            // the plain token, once /init has proved it
	defaults map[string]string // env vars every new process starts with
	user     string            // default user; "" means the container's own
	workdir  string            // default cwd; "" means the user's home
}

// ParseTokenHash decodes the annotation's value: 64 lowercase hex digits.
func ParseTokenHash(v string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	if len(v) != hex.EncodedLen(sha256.Size) {
		return h, fmt.Errorf("want %d hex digits, got %d", hex.EncodedLen(sha256.Size), len(v))
	}
	for _, c := range v {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return h, fmt.Errorf("want lowercase hex digits")
		}
	}
	_, err := hex.Decode(h[:], []byte(v))
	return h, err
}

// New returns envd for c, accepting the token whose SHA-256 is tokenHash.
func New(c Container, tokenHash [sha256.Size]byte) *Server {
	s := &Server{container: c, tokenHash: tokenHash}
	s.processes = newProcessService(s)
	return s
}

// Handler routes envd's HTTP API. Every route but /health is behind the
// access token, and every one answers a browser's CORS requests.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /init", s.init)
	mux.Handle("/", s.authorized(s.routes()))
	return withCORS(mux)
}

// routes are the token-protected routes: the Connect services and /files
// register here.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(s.processes.handler())
	mux.Handle(filesystemconnect.NewFilesystemHandler(newFilesystemService(s), connect.WithReadMaxBytes(maxRPCMessage)))
	mux.HandleFunc("GET "+filesPath, s.download)
	mux.HandleFunc("POST "+filesPath, s.upload)
	return mux
}

// tokenMatches compares in constant time, so that response times do not
// reveal how much of a guess was right.
func (s *Server) tokenMatches(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], s.tokenHash[:]) == 1
}

func (s *Server) authorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A signed /files URL carries no token: its handler checks the
		// signature, which needs the plain token from /init.
		if !s.tokenMatches(r.Header.Get("X-Access-Token")) && !signedFilesRequest(r) {
			writeError(w, http.StatusUnauthorized, "invalid access token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// initRequest is the body the control plane posts once the pod runs.
type initRequest struct {
	AccessToken    string            `json:"accessToken"`
	EnvVars        map[string]string `json:"envVars"`
	DefaultUser    string            `json:"defaultUser"`
	DefaultWorkdir string            `json:"defaultWorkdir"`
}

// init learns the plain token (proved by its hash) and the defaults of new
// processes. It is idempotent: the control plane calls it again after a
// failure.
func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxInitBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "init body: "+err.Error())
		return
	}
	if !s.tokenMatches(req.AccessToken) {
		writeError(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	s.mu.Lock()
	s.token = req.AccessToken
	s.defaults = req.EnvVars
	s.user = req.DefaultUser
	s.workdir = req.DefaultWorkdir
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// writeError answers in the shape envd uses: {"code":..,"message":..}.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}
