// Package proxmox is vmgate's Proxmox VE backend: a hypervisor.Driver over
// the Proxmox VE REST API (api2/json) with an API token, through
// github.com/luthermonson/go-proxmox (its client, tasks, VM and cluster
// types) with an HTTP client of ours that keeps Proxmox's error answers
// (status, message, parameter errors) instead of go-proxmox's bare "not
// authorized" and status line.
//
// VMs are QEMU guests listed by GET /cluster/resources; vmgate names them
// by vmid ("101", so "pve/101" on the server) and finds each one's node, and
// which nodes are offline, in the same listing. A VM that migrated is
// followed, a VM on an offline node reported so (cluster.go). Guest operations go through Proxmox's
// agent/* endpoints, which relay to the VM's QEMU guest agent: exec and
// exec-status are mapped onto guest/qga's Caller, so timeouts, output caps,
// env and cwd work exactly as with the QEMU backend; file-read and
// file-write are used as Proxmox offers them.
//
// Power actions are worker tasks: Proxmox answers a UPID at once and the
// outcome is only in the task's status, which the driver waits for; a
// failed task is a *TaskError (hypervisor.ErrBackend) with its exit status.
// Open reads the version (GET /version) and the token's privileges (GET
// /access/permissions), which differ between PVE 8 and 9 (Privileges).
// Errors Proxmox words itself (a refused privilege, a failed task) carry
// that reason as hypervisor.ErrBackend; the token secret never appears in
// an error.
//
// Proxmox returns agent output and file content as JSON strings holding one
// character per byte (U+0000 to U+00FF); the driver maps them back to bytes,
// so binary data round-trips. Proxmox limits file-write content to 60 KiB
// per request: larger files are written in parts and joined in the guest
// with cat through agent/exec (which then needs guest-exec enabled).
//
// Node names and vmids are validated before they reach a URL.
package proxmox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/luthermonson/go-proxmox"

	"github.com/vmgate/vmgate/hypervisor"
)

// APIError is an error answer of the Proxmox API: its HTTP status, the
// handler's message (the body's "message", which pve-http-server 5.2 and
// later send in full, else the status line's reason, which is its first
// line), and per-parameter errors ({"data":null,"errors":{"param":"message"}}).
type APIError struct {
	StatusCode int
	Message    string
	Errors     map[string]string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("HTTP %d: %s", e.StatusCode, e.Message)
	if len(e.Errors) > 0 {
		for _, k := range slices.Sorted(maps.Keys(e.Errors)) {
			msg += fmt.Sprintf("; %s: %s", k, strings.TrimSpace(e.Errors[k]))
		}
	}
	return msg
}

// ErrAuth: the API refused the token (HTTP 401) or its permissions (403).
var ErrAuth = errors.New("proxmox API refused the token")

// Limits of the vmid and node name grammar (Proxmox's own).
const (
	MinVMID = 100
	MaxVMID = 999999999
)

var (
	nodeRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)
	vmidRE = regexp.MustCompile(`^[1-9][0-9]{2,8}$`)
	// tokenIDRE is USER@REALM!TOKENID as pve-access-control's
	// $token_full_regex takes it (user [^\s:/]+, realm and token id a letter
	// and at least one more character), without '@', '!' or '=' in the
	// user so the header splits one way.
	tokenIDRE = regexp.MustCompile(`^[^\s@!:=/]+@[A-Za-z][A-Za-z0-9._-]+![A-Za-z][A-Za-z0-9._-]+$`)
)

// ParseVMID checks that name is a Proxmox vmid (100 to 999999999, decimal,
// no sign, no leading zero) and returns it.
func ParseVMID(name string) (int, error) {
	if !vmidRE.MatchString(name) {
		return 0, fmt.Errorf("%w: %q is not a vmid (%d-%d)", hypervisor.ErrInvalidArgument, name, MinVMID, MaxVMID)
	}
	n, err := strconv.Atoi(name)
	if err != nil || n < MinVMID || n > MaxVMID {
		return 0, fmt.Errorf("%w: %q is not a vmid (%d-%d)", hypervisor.ErrInvalidArgument, name, MinVMID, MaxVMID)
	}
	return n, nil
}

// CheckNode checks that node is a valid Proxmox node name (a host name
// label: letters, digits and inner hyphens, at most 63 characters).
func CheckNode(node string) error {
	if !nodeRE.MatchString(node) {
		return fmt.Errorf("%w: %q is not a node name", hypervisor.ErrInvalidArgument, node)
	}
	return nil
}

// api is the HTTP side: a go-proxmox client whose HTTP client turns every
// answer but 200 into an *APIError (go-proxmox keeps only "not authorized"
// of a 401 or 403 and only the status line of a 500) and bounds answers.
type api struct {
	base   *url.URL // ends in /api2/json
	c      *proxmox.Client
	client *http.Client
	log    *slog.Logger
	// tls and authz are what a websocket to the API needs (websocket.go):
	// the client's TLS settings and its Authorization header.
	tls   *tls.Config
	authz string
	// route, when set, sends what do is given: the driver's placement
	// (cluster.go), which puts a request about a VM on the VM's node. It
	// is set once, before the first request.
	route func(ctx context.Context, method, path string, query url.Values, body, out any) error
}

func newAPI(cfg Config, log *slog.Logger) (*api, error) {
	bad := func(format string, args ...any) (*api, error) {
		return nil, fmt.Errorf("proxmox: config: %w: "+format, append([]any{hypervisor.ErrInvalidArgument}, args...)...)
	}
	u, err := url.Parse(cfg.URL) // checked by New (Config.check)
	if err != nil {
		return nil, fmt.Errorf("proxmox: config: url: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(u.Path, "/api2/json") {
		u.Path += "/api2/json"
	}
	raw, err := os.ReadFile(cfg.TokenSecretFile)
	if err != nil {
		return nil, fmt.Errorf("proxmox: config: token secret file: %w", err)
	}
	secret := strings.TrimSpace(string(raw))
	if secret == "" || strings.ContainsAny(secret, " \t\r\n\x00") || !utf8.ValidString(secret) {
		return bad("token secret file %s must hold one secret on one line", cfg.TokenSecretFile)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("proxmox: config: ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return bad("ca file %s holds no PEM certificate", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	if cfg.InsecureSkipVerify {
		log.Warn("TLS certificate verification is OFF for the Proxmox API (insecure_skip_verify): anyone on the path can read the API token", "url", u.Redacted())
		tlsCfg.InsecureSkipVerify = true
	}
	tr := &http.Transport{
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	hc := &http.Client{Transport: errorTransport{base: tr}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	c := proxmox.NewClient(u.String(), proxmox.WithHTTPClient(hc), proxmox.WithAPIToken(cfg.TokenID, secret),
		proxmox.WithUserAgent("vmgate"), proxmox.WithLogger(libLogger{log}))
	return &api{base: u, c: c, client: hc, log: log, tls: tlsCfg, authz: "PVEAPIToken=" + cfg.TokenID + "=" + secret}, nil
}

// maxResponseBytes bounds one API answer (file-read returns up to 16 MiB,
// which JSON-escaped may take up to six bytes per byte).
const maxResponseBytes = 128 << 20

// maxErrorBytes bounds the body of an error answer.
const maxErrorBytes = 64 << 10

// do sends one request: through route when it is set, else as it is
// (send). Every request of the driver goes through here.
func (a *api) do(ctx context.Context, method, path string, query url.Values, body any, out any) error {
	if a.route != nil {
		return a.route(ctx, method, path, query, body, out)
	}
	return a.send(ctx, method, path, query, body, out)
}

// send sends one request through go-proxmox. path is relative to
// /api2/json and already built from validated parts; query and body (JSON)
// are optional. The answer's "data" is decoded into out (nil: discarded).
func (a *api) send(ctx context.Context, method, path string, query url.Values, body any, out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	var data []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		data = b
	}
	err := unwrapAPIError(a.c.Req(ctx, method, path, data, out))
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	if errors.As(err, &se) || errors.As(err, &te) {
		return fmt.Errorf("%w: the answer to %s %s is not what Proxmox sends: %w", hypervisor.ErrBackend, method, strings.SplitN(path, "?", 2)[0], err)
	}
	return err
}

// unwrapAPIError takes an *APIError out of the *url.Error net/http wraps it
// in, adding ErrAuth for a 401 or 403.
func unwrapAPIError(err error) error {
	var ae *APIError
	if err == nil || !errors.As(err, &ae) {
		return err
	}
	if ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w: %w", ErrAuth, ae)
	}
	return ae
}

// errorTransport turns an answer other than 200 into an *APIError and
// bounds the body of a 200.
type errorTransport struct{ base http.RoundTripper }

func (t errorTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		resp.Body = &limitedBody{rc: resp.Body, left: maxResponseBytes}
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	e := &APIError{StatusCode: resp.StatusCode, Message: statusMessage(resp)}
	var env struct {
		Message string            `json:"message"`
		Errors  map[string]string `json:"errors"`
	}
	if json.Unmarshal(raw, &env) == nil {
		e.Errors = env.Errors
		if m := strings.TrimSpace(env.Message); m != "" {
			e.Message = m
		}
	}
	return nil, e
}

// limitedBody fails a read past its limit instead of cutting the answer.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("answer larger than %d bytes", maxResponseBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// libLogger gives go-proxmox's log lines to slog. Its debug lines hold
// request bodies (stdin, file content), so they are dropped; and it must
// never write to stdout, which carries the plugin handshake.
type libLogger struct{ log *slog.Logger }

func (libLogger) Debugf(string, ...any)            {}
func (libLogger) Infof(string, ...any)             {}
func (l libLogger) Warnf(format string, v ...any)  { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l libLogger) Errorf(format string, v ...any) { l.log.Warn(fmt.Sprintf(format, v...)) }

// statusMessage is the text Proxmox puts after the code in the status line.
func statusMessage(resp *http.Response) string {
	msg := strings.TrimSpace(strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)))
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return msg
}

// bytesString turns a Proxmox byte string (one character per byte) back
// into bytes. A character above U+00FF is a protocol error.
func bytesString(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, fmt.Errorf("byte string holds U+%04X, above U+00FF", r)
		}
		out = append(out, byte(r))
	}
	return out, nil
}

// byteString is the inverse of bytesString: one character per byte, so the
// JSON encoding is lossless whatever the bytes are.
func byteString(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for _, c := range b {
		sb.WriteRune(rune(c))
	}
	return sb.String()
}

// flexBool decodes the booleans Proxmox writes as true/false or 1/0.
type flexBool bool

func (f *flexBool) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true", "1":
		*f = true
	case "false", "0", "null":
		*f = false
	default:
		return fmt.Errorf("not a boolean: %s", b)
	}
	return nil
}
