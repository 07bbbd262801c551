package ui_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/ui"
)

// clockedPage is a page on f's server with a clock the test moves.
func clockedPage(t *testing.T, f *fixture, hosts []string) (*ui.Handler, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	now.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	page, err := ui.New(ui.Config{
		Approvals: f.srv.Approvals(), AuditPath: filepath.Join(t.TempDir(), "audit.log"),
		TokenSHA256: sha(operatorToken), AllowedHosts: hosts,
		Now: func() time.Time { return time.Unix(0, now.Load()) },
	})
	if err != nil {
		t.Fatalf("ui.New: %v", err)
	}
	return page, now
}

// tryLogin posts one login from remote with a valid CSRF pair.
func tryLogin(page http.Handler, remote, token string) *httptest.ResponseRecorder {
	form := url.Values{"csrf": {"c"}, "token": {token}}
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/ui/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: ui.LoginCookie, Value: "c"})
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, req)
	return rec
}

// 200 wrong tokens in a burst, from one address or from 200: only a
// handful are even compared; the rest get 429 with Retry-After, the right
// token included, until the window slides.
func TestLoginThrottle(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name    string
		remote  func(i int) string
		checked int
	}{
		{"one address", func(int) string { return "192.0.2.7:4000" }, ui.LoginFailuresPerAddr},
		{"one IPv6 /64", func(i int) string { return fmt.Sprintf("[2001:db8::%x]:4000", i+1) }, ui.LoginFailuresPerAddr},
		{"200 addresses", func(i int) string { return fmt.Sprintf("198.51.100.%d:4000", i%250) }, ui.LoginFailuresTotal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, now := clockedPage(t, f, nil)
			checked, throttled := 0, 0
			for i := range 200 {
				rec := tryLogin(page, tt.remote(i), fmt.Sprintf("guess-%d", i))
				switch rec.Code {
				case http.StatusUnauthorized:
					checked++
				case http.StatusTooManyRequests:
					throttled++
					if rec.Header().Get("Retry-After") == "" {
						t.Fatalf("429 without Retry-After")
					}
				default:
					t.Fatalf("wrong login %d = %d %q", i, rec.Code, rec.Body.String())
				}
			}
			if checked != tt.checked || throttled != 200-tt.checked {
				t.Errorf("200 wrong logins: %d checked, %d throttled; want %d checked", checked, throttled, tt.checked)
			}
			if rec := tryLogin(page, tt.remote(0), operatorToken); rec.Code != http.StatusTooManyRequests {
				t.Errorf("the right token while throttled = %d; want 429 (nothing is compared)", rec.Code)
			}
			now.Add(int64(ui.LoginWindow))
			if rec := tryLogin(page, tt.remote(0), operatorToken); rec.Code != http.StatusSeeOther {
				t.Errorf("the right token a window later = %d %q; want 303 (signed in)", rec.Code, rec.Body.String())
			}
		})
	}
	// Another address is not held up by one address's failures.
	page, _ := clockedPage(t, f, nil)
	for range 10 {
		tryLogin(page, "192.0.2.9:1", "wrong")
	}
	if rec := tryLogin(page, "192.0.2.10:1", operatorToken); rec.Code != http.StatusSeeOther {
		t.Errorf("login from a clean address = %d; want 303", rec.Code)
	}
}

// /metrics behind OperatorOnly: the Host check holds even with the
// operator token, and wrong tokens are throttled like logins.
func TestOperatorOnlyChecksHostAndThrottles(t *testing.T) {
	f := newFixture(t)
	page, _ := clockedPage(t, f, []string{"ops.example:8707"})
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("metrics")) })
	h := page.OperatorOnly(inner)
	get := func(host, remote, token string) int {
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/metrics", nil)
		req.Host, req.RemoteAddr = host, remote
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	tests := []struct {
		name, host, token string
		want              int
	}{
		{"loopback host, operator token", "127.0.0.1:8707", operatorToken, http.StatusOK},
		{"allowed host, operator token", "ops.example:8707", operatorToken, http.StatusOK},
		{"rebinding host, operator token", "evil.example:8707", operatorToken, http.StatusForbidden},
		{"rebinding host, no token", "evil.example", "", http.StatusForbidden},
		{"loopback host, agent token", "localhost:8707", agentToken, http.StatusUnauthorized},
		{"loopback host, no token", "localhost", "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		if got := get(tt.host, "192.0.2.1:1", tt.token); got != tt.want {
			t.Errorf("%s: GET /metrics = %d; want %d", tt.name, got, tt.want)
		}
	}
	for i := range 50 {
		get("localhost", "192.0.2.2:1", fmt.Sprintf("guess-%d", i))
	}
	if got := get("localhost", "192.0.2.2:1", operatorToken); got != http.StatusTooManyRequests {
		t.Errorf("GET /metrics after 50 wrong tokens = %d; want 429", got)
	}
}
