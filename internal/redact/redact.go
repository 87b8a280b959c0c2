// Package redact removes credentials from store URLs and from the error
// messages and log lines that quote them: the user info of a URL
// (user:password@), the values of its query string (S3 and CDN signatures,
// tokens), and secrets the caller names (an S3 secret key, a registry
// password). Messages keep everything else, so an error still says which
// store and which object failed.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mark replaces what was removed.
const Mark = "REDACTED"

// urlRe finds URLs inside free text: a scheme, "://" and everything up to
// white space or a quote.
var urlRe = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>` + "`" + `]+`)

// URL returns raw without user info and with every query value replaced.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redactUnparsed(raw)
	}
	if u.User != nil {
		u.User = url.User(Mark)
	}
	if u.RawQuery != "" {
		u.RawQuery = query(u.RawQuery)
	}
	return u.String()
}

// redactUnparsed handles text url.Parse refused: it cuts user info and
// query by hand, since an unparseable URL may still carry both.
func redactUnparsed(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		raw = raw[:i+1] + query(raw[i+1:])
	}
	if s := strings.Index(raw, "://"); s >= 0 {
		rest := raw[s+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
			raw = raw[:s+3] + Mark + rest[at:]
		}
	}
	return raw
}

// query keeps the parameter names (they say which kind of signature it
// was) and drops every value.
func query(q string) string {
	parts := strings.Split(q, "&")
	for i, p := range parts {
		name, _, _ := strings.Cut(p, "=")
		parts[i] = name + "=" + Mark
	}
	return strings.Join(parts, "&")
}

// String redacts every URL in s and every occurrence of the given secrets
// (empty and very short ones are ignored: they would match everywhere).
func String(s string, secrets ...string) string {
	s = urlRe.ReplaceAllStringFunc(s, URL)
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, Mark)
		}
	}
	return s
}

// Error returns err with a redacted message; it unwraps to err, so
// errors.Is and errdefs checks see the same causes.
func Error(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	red := String(msg, secrets...)
	if red == msg {
		return err
	}
	return &redacted{msg: red, err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
