// Package envdweb is what envd (agent/envd, in the guest) and the cluster's
// E2B gateway (e2bapi) must agree on and may not import from each other:
// envd's port and the CORS policy a browser's SDK meets, which is E2B's
// envd's.
package envdweb

import (
	"net/http"
	"time"

	connectcors "connectrpc.com/cors"
	"github.com/rs/cors"
)

// Port is where envd listens in a sandbox pod, as E2B's does.
const Port = 49983

// CORS is envd's policy: any origin, the methods envd serves, any header,
// and the Connect protocol's response headers exposed. It lets the SDK call
// envd from a browser.
func CORS() cors.Options {
	return cors.Options{
		AllowedOrigins: []string{"*"},
		AllowedMethods: []string{http.MethodHead, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete},
		AllowedHeaders: []string{"*"},
		ExposedHeaders: append(connectcors.ExposedHeaders(), "Location", "Cache-Control", "X-Content-Type-Options"),
		MaxAge:         int((2 * time.Hour).Seconds()),
	}
}
