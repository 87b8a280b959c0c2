package envd

import (
	"net/http"
	"time"

	connectcors "connectrpc.com/cors"
	"github.com/rs/cors"
)

// withCORS lets the SDK call envd from a browser, as E2B's envd does (the
// same policy): any origin, the methods envd serves, any header, and the
// Connect protocol's response headers exposed. It stands outside the token
// check, which a browser's preflight carries no token for; what it allows
// still needs the token.
func withCORS(h http.Handler) http.Handler {
	return cors.New(cors.Options{
		AllowedOrigins: []string{"*"},
		AllowedMethods: []string{http.MethodHead, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete},
		AllowedHeaders: []string{"*"},
		ExposedHeaders: append(connectcors.ExposedHeaders(), "Location", "Cache-Control", "X-Content-Type-Options"),
		MaxAge:         int((2 * time.Hour).Seconds()),
	}).Handler(h)
}
