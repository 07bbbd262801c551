// Package ui is the operator's approvals page, served at /ui on vmgate's
// HTTP listener: pending approvals with every argument their call will run
// with (stdin, file content and env values included, rendered by argview;
// the first bytes of each in the list, all of them on the page of one
// approval, /ui/approval?id=ID) and Approve and Deny, recent decisions
// from the audit log with filters, the counters with their limits and when
// they free up, and the VMs with their state and agent status. Two more
// pages read the audit log as `vmgate audit search` and `vmgate policy
// suggest` do: /ui/calls, the recent calls with the search's filters
// (calls.go), and /ui/tighten, each grant's suggested policy and its diff
// against the one in force (tighten.go).
//
// It is server-rendered (html/template, no build step) and works without
// JavaScript; refresh.js only reloads the pending list every few seconds.
// It does not import mcp-go: the approvals come through the small
// Approvals interface, which *server.Approvals implements.
//
// # Security
//
// The page is behind the operator token, which is not a grant: a grant's
// bearer token does not open it, and the operator token cannot make tool
// calls. The config holds only the token's SHA-256; the login form's token
// is compared with it in constant time, and wrong tokens are throttled per
// client address; the right one always passes the count of all addresses
// (throttle.go). A login sets a random session id in
// an HttpOnly, SameSite=Strict cookie (Secure when served over TLS) scoped
// to /ui. Every form carries a CSRF token, the HMAC-SHA256 of the session id
// under a key made at start (the login form, before any session, uses a
// double-submit cookie). POSTs with another Origin, and requests with a Host
// that is neither loopback nor allowed (DNS rebinding), are refused. Every
// response forbids framing and caching and carries a strict
// Content-Security-Policy (scripts and styles from /ui/static only).
//
// Sessions live in memory: a restart logs the operator out.
//
// # Concurrency
//
// A Handler is safe for concurrent use.
package ui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/hostguard"
	"github.com/vmgate/vmgate/policy/store"
)

// Prefix is where the page is mounted.
const Prefix = "/ui"

// Cookie names.
const (
	SessionCookie = "vmgate_session"
	LoginCookie   = "vmgate_login_csrf"
)

// MaxReasonLen bounds the reason an operator types.
const MaxReasonLen = 1000

// maxSessions bounds live sessions; a login beyond it drops the oldest.
const maxSessions = 256

// Approvals is the operator's side of parked calls (*server.Approvals).
type Approvals interface {
	List(ctx context.Context) ([]store.Approval, error)
	Grant(ctx context.Context, id, by, reason string) (store.Approval, error)
	Deny(ctx context.Context, id, by, reason string) (store.Approval, error)
}

// Backend is one hypervisor backend whose VMs the page lists.
type Backend struct {
	Name   string
	Driver hypervisor.Driver
}

// Config is what New needs.
type Config struct {
	Approvals Approvals
	// AuditPath is the audit log the page reads decisions and counters from.
	AuditPath string
	Backends  []Backend
	// TokenSHA256 is the lowercase hex SHA-256 of the operator token (required).
	TokenSHA256 string
	// OperatorName is who the audit log says decided (default "operator").
	OperatorName string
	// Secure marks the cookies Secure (set it when serving over TLS).
	Secure bool
	// AllowedHosts are Host values accepted besides loopback names;
	// AllowedOrigins are Origins accepted besides the page's own.
	AllowedHosts   []string
	AllowedOrigins []string
	// Tighten feeds the tightening page (/ui/tighten, tighten.go); nil:
	// that page says it is off. The calls page (/ui/calls) needs only
	// AuditPath.
	Tighten *Tighten
	// SessionTTL is how long a login lasts (default 12 h).
	SessionTTL time.Duration
	Logger     *slog.Logger     // default slog.Default()
	Now        func() time.Time // default time.Now
}

// Handler serves the page.
type Handler struct {
	cfg     Config
	token   [32]byte
	csrfKey []byte
	journal *journal
	pages   *template.Template
	static  http.Handler
	log     *slog.Logger
	now     func() time.Time

	throttle *loginThrottle // wrong operator tokens (throttle.go)

	// mu guards sessions.
	mu       sync.Mutex
	sessions map[string]time.Time // session id -> expiry
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ErrConfig: New was given an unusable Config.
var ErrConfig = errors.New("invalid ui config")

// New validates cfg and builds the page's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Approvals == nil {
		return nil, fmt.Errorf("ui: new: %w: no approvals", ErrConfig)
	}
	if cfg.AuditPath == "" {
		return nil, fmt.Errorf("ui: new: %w: no audit log path", ErrConfig)
	}
	h, err := hex.DecodeString(cfg.TokenSHA256)
	if err != nil || len(h) != 32 || strings.ToLower(cfg.TokenSHA256) != cfg.TokenSHA256 {
		return nil, fmt.Errorf("ui: new: %w: operator token_sha256 is not 64 lowercase hex digits", ErrConfig)
	}
	for _, b := range cfg.Backends {
		if b.Name == "" || b.Driver == nil {
			return nil, fmt.Errorf("ui: new: %w: backend %q without a name or a driver", ErrConfig, b.Name)
		}
	}
	if cfg.OperatorName == "" {
		cfg.OperatorName = "operator"
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("ui: new: templates: %w", err)
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("ui: new: static: %w", err)
	}
	u := &Handler{
		cfg: cfg, csrfKey: make([]byte, 32), journal: newJournal(cfg.AuditPath), pages: pages,
		static: http.StripPrefix(Prefix+"/static/", http.FileServerFS(sub)),
		log:    cfg.Logger, now: cfg.Now, sessions: map[string]time.Time{},
		throttle: newLoginThrottle(cfg.Now),
	}
	copy(u.token[:], h)
	rand.Read(u.csrfKey)
	return u, nil
}

var funcs = template.FuncMap{
	"ago": func(now, t time.Time) string { return roundDur(now.Sub(t)) },
	"in": func(now, t time.Time) string {
		if !t.After(now) {
			return "now"
		}
		return "in " + roundDur(t.Sub(now))
	},
	"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"dur":   roundDur,
}

func roundDur(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// CheckToken reports whether token is the operator token (constant time).
// cmd/vmgate uses it to put /metrics behind the operator token.
func (u *Handler) CheckToken(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return token != "" && subtle.ConstantTimeCompare(sum[:], u.token[:]) == 1
}

// ServeHTTP routes the page's requests.
func (u *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin") // no-referrer would make the browser send "Origin: null" on our own POSTs
	hdr.Set("Cache-Control", "no-store")
	if !u.hostAllowed(r.Host) {
		http.Error(w, "forbidden host", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodPost && !u.originAllowed(r) {
		http.Error(w, "forbidden origin", http.StatusForbidden)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, Prefix)
	switch {
	case strings.HasPrefix(path, "/static/") && r.Method == http.MethodGet:
		hdr.Set("Cache-Control", "max-age=300")
		u.static.ServeHTTP(w, r)
	case path == "/login" && r.Method == http.MethodGet:
		u.loginForm(w, r, "")
	case path == "/login" && r.Method == http.MethodPost:
		u.login(w, r)
	case path == "" || path == "/":
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if _, ok := u.session(r); !ok {
			http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
			return
		}
		u.page(w, r)
	case path == "/approval" && r.Method == http.MethodGet:
		sid, ok := u.session(r)
		if !ok {
			http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
			return
		}
		u.approval(w, r, sid)
	case (path == "/calls" || path == "/tighten") && r.Method == http.MethodGet:
		sid, ok := u.session(r)
		if !ok {
			http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
			return
		}
		if path == "/calls" {
			u.calls(w, r, sid)
		} else {
			u.tighten(w, r, sid)
		}
	case path == "/pending" && r.Method == http.MethodGet:
		sid, ok := u.session(r)
		if !ok {
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		u.pending(w, r, sid)
	case path == "/decide" && r.Method == http.MethodPost:
		u.decide(w, r)
	case path == "/logout" && r.Method == http.MethodPost:
		u.logout(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (u *Handler) hostAllowed(host string) bool {
	return hostguard.Allowed(host, u.cfg.AllowedHosts)
}

// originAllowed: a POST's Origin (when the browser sends one) must be the
// page's own or an allowed one.
func (u *Handler) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	ou, err := url.Parse(o)
	if err != nil {
		return false
	}
	return ou.Host == r.Host || slices.Contains(u.cfg.AllowedOrigins, o)
}

// session returns the request's live session id.
func (u *Handler) session(r *http.Request) (string, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return "", false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	exp, ok := u.sessions[c.Value]
	if !ok {
		return "", false
	}
	if !u.now().Before(exp) {
		delete(u.sessions, c.Value)
		return "", false
	}
	return c.Value, true
}

// csrf is the form token of session sid.
func (u *Handler) csrf(sid string) string {
	m := hmac.New(sha256.New, u.csrfKey)
	m.Write([]byte("vmgate-ui-csrf\x00" + sid))
	return hex.EncodeToString(m.Sum(nil))
}

func (u *Handler) csrfOK(sid, got string) bool {
	want := u.csrf(sid)
	return len(got) == len(want) && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (u *Handler) cookie(name, value, path string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: path, MaxAge: maxAge, HttpOnly: true, Secure: u.cfg.Secure, SameSite: http.SameSiteStrictMode}
}

func (u *Handler) loginForm(w http.ResponseWriter, r *http.Request, msg string) {
	tok := rand.Text()
	http.SetCookie(w, u.cookie(LoginCookie, tok, Prefix+"/login", 600))
	status := http.StatusOK
	if msg != "" {
		status = http.StatusUnauthorized
	}
	u.render(w, status, "login.html", map[string]any{"CSRF": tok, "Error": msg})
}

func (u *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	c, err := r.Cookie(LoginCookie)
	form := r.PostForm.Get("csrf")
	if err != nil || c.Value == "" || subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) != 1 {
		http.Error(w, "invalid or missing CSRF token; reload the login page", http.StatusForbidden)
		return
	}
	if wait, blocked := u.throttle.blocked(r.RemoteAddr); blocked {
		u.log.Warn("ui: operator login throttled", "remote", r.RemoteAddr)
		refuseThrottled(w, wait)
		return
	}
	if !u.CheckToken(r.PostForm.Get("token")) {
		if f := u.throttle.fail(r.RemoteAddr); f.overall {
			u.logThrottled(f, r)
			refuseThrottled(w, f.wait)
			return
		}
		u.log.Warn("ui: failed operator login", "remote", r.RemoteAddr)
		u.loginForm(w, r, "That is not the operator token.")
		return
	}
	sid := rand.Text() + rand.Text()
	u.mu.Lock()
	now := u.now()
	for id, exp := range u.sessions {
		if !now.Before(exp) {
			delete(u.sessions, id)
		}
	}
	for len(u.sessions) >= maxSessions {
		var oldest string
		for id, exp := range u.sessions {
			if oldest == "" || exp.Before(u.sessions[oldest]) {
				oldest = id
			}
		}
		delete(u.sessions, oldest)
	}
	u.sessions[sid] = now.Add(u.cfg.SessionTTL)
	u.mu.Unlock()
	u.log.Info("ui: operator logged in", "operator", u.cfg.OperatorName, "remote", r.RemoteAddr)
	http.SetCookie(w, u.cookie(LoginCookie, "", Prefix+"/login", -1))
	http.SetCookie(w, u.cookie(SessionCookie, sid, Prefix, int(u.cfg.SessionTTL.Seconds())))
	http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
}

func (u *Handler) logout(w http.ResponseWriter, r *http.Request) {
	sid, ok := u.session(r)
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if !ok || r.ParseForm() != nil || !u.csrfOK(sid, r.PostForm.Get("csrf")) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	u.mu.Lock()
	delete(u.sessions, sid)
	u.mu.Unlock()
	http.SetCookie(w, u.cookie(SessionCookie, "", Prefix, -1))
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func (u *Handler) render(w http.ResponseWriter, status int, name string, data any) {
	var b strings.Builder
	if err := u.pages.ExecuteTemplate(&b, name, data); err != nil {
		u.log.Error("ui: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(b.String()))
}
