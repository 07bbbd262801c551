package ui

import (
	"net/http"
	"strings"
)

// OperatorOnly lets a request through to next only with an allowed Host
// (loopback or Config.AllowedHosts, against DNS rebinding, token or not)
// and the operator token as "Authorization: Bearer <token>". Wrong tokens
// are throttled like logins (throttle.go: the right one always passes,
// unless its own address sent too many wrong ones). cmd/vmgate puts
// /metrics behind it.
func (u *Handler) OperatorOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if !u.hostAllowed(r.Host) {
			http.Error(w, "forbidden host", http.StatusForbidden)
			return
		}
		if wait, blocked := u.throttle.blocked(r.RemoteAddr); blocked {
			refuseThrottled(w, wait)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !u.CheckToken(tok) {
			if ok || r.Header.Get("Authorization") != "" {
				if f := u.throttle.fail(r.RemoteAddr); f.overall {
					u.logThrottled(f, r)
					refuseThrottled(w, f.wait)
					return
				}
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="vmgate-operator"`)
			http.Error(w, "operator token required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
