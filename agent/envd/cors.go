package envd

import (
	"net/http"

	"github.com/rs/cors"

	"github.com/cryo-runtime/cryo/internal/envdweb"
)

// withCORS answers a browser's CORS requests as E2B's envd does. It stands
// outside the token check, which a browser's preflight carries no token
// for; what it allows still needs the token.
func withCORS(h http.Handler) http.Handler {
	return cors.New(envdweb.CORS()).Handler(h)
}
