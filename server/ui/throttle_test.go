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

// 200 wrong tokens in a burst, from one address or from 200: from one,
// only a handful are even compared and the rest get 429 with Retry-After,
// the right token included, until the window slides; from 200, each is
// compared, those beyond the total get 429 with Retry-After, and the right
// token still signs in (finding 9 of issue 29: wrong tokens from anywhere
// locked the operator out).
func TestLoginThrottle(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name      string
		remote    func(i int) string
		checked   int
		rightCode int // the right token from remote(0) right after the burst
	}{
		{"one address", func(int) string { return "192.0.2.7:4000" }, ui.LoginFailuresPerAddr, http.StatusTooManyRequests},
		{"one IPv6 /64", func(i int) string { return fmt.Sprintf("[2001:db8::%x]:4000", i+1) }, ui.LoginFailuresPerAddr, http.StatusTooManyRequests},
		{"200 addresses", func(i int) string { return fmt.Sprintf("198.51.100.%d:4000", i%250) }, ui.LoginFailuresTotal, http.StatusSeeOther},
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
				t.Errorf("200 wrong logins: %d answered 401, %d throttled; want %d answered 401", checked, throttled, tt.checked)
			}
			if rec := tryLogin(page, tt.remote(0), operatorToken); rec.Code != tt.rightCode {
				t.Errorf("the right token right after = %d; want %d", rec.Code, tt.rightCode)
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

// The count of all addresses never refuses the right token: after
// LoginFailuresTotal wrong tokens from other addresses, a wrong one from a
// fresh address gets 429 with Retry-After, and the right one from a fresh
// address, or from one that sent a wrong token, is let in, on the login
// form and on /metrics.
func TestThrottleLetsTheRightTokenThrough(t *testing.T) {
	f := newFixture(t)
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("metrics")) })
	metrics := func(page *ui.Handler, remote, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/metrics", nil)
		req.RemoteAddr = remote
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		page.OperatorOnly(inner).ServeHTTP(rec, req)
		return rec
	}
	login := func(page *ui.Handler, remote, token string) *httptest.ResponseRecorder {
		return tryLogin(page, remote, token)
	}
	tests := []struct {
		name   string
		try    func(page *ui.Handler, remote, token string) *httptest.ResponseRecorder
		wrong  int // the status of a wrong token within the limits
		signIn int // the status of the right token
	}{
		{"login", login, http.StatusUnauthorized, http.StatusSeeOther},
		{"/metrics", metrics, http.StatusUnauthorized, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, _ := clockedPage(t, f, nil)
			for i := range ui.LoginFailuresTotal {
				if rec := tt.try(page, fmt.Sprintf("203.0.113.%d:5000", i+1), "wrong"); rec.Code != tt.wrong {
					t.Fatalf("wrong token %d = %d; want %d", i, rec.Code, tt.wrong)
				}
			}
			rec := tt.try(page, "203.0.113.200:5000", "wrong")
			if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
				t.Errorf("a wrong token past the total = %d (Retry-After %q); want 429 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
			}
			for _, remote := range []string{"203.0.113.201:5000", "203.0.113.1:5001", "[2001:db8:1::7]:5000"} {
				if rec := tt.try(page, remote, operatorToken); rec.Code != tt.signIn {
					t.Errorf("the right token from %s after %d wrong ones from elsewhere = %d %q; want %d",
						remote, ui.LoginFailuresTotal+1, rec.Code, rec.Body.String(), tt.signIn)
				}
			}
		})
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
