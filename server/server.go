// Package server is vmgate's MCP adapter: the tool catalogue, the gate every
// tools/call passes through, and the stdio and streamable HTTP transports
// with their authentication. It is the only package that imports mcp-go.
//
// # The gate
//
// mcp-go validates arguments and filters tools before any tool middleware
// runs, so a gate written as middleware would not see unknown tools or
// malformed arguments. The gate therefore sits in front of mcp-go at the
// JSON-RPC message level: ServeStdio runs its own line loop and Handler
// wraps mcp-go's streamable HTTP handler, and both hand every message to
// (*Server).gateMessage before (*MCPServer).HandleMessage sees it. A
// message that fails strict decoding never reaches mcp-go. A tools/call
// is decoded strictly, validated against the catalogue, decided by the
// grant's policy, approved, reserved in the store and recorded durably in
// the audit log; only then is it passed to mcp-go with a single-use ticket
// in its context. Tool handlers refuse to run without that ticket and run
// with the arguments the gate checked, not with mcp-go's own decoding.
//
// # Concurrency
//
// A Server is safe for concurrent use; its transports serve calls
// concurrently. Grants, backends and the catalogue are immutable after New.
package server

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

// Name and Version are what the server reports in initialize.
const Name = "vmgate"

// Version is reported in initialize; cmd/vmgate sets it at start.
var Version = "dev"

// Auditor is the audit log as the gate uses it; *audit.Log implements it.
type Auditor interface {
	// Append writes rec and returns once it is durable (decision records).
	Append(ctx context.Context, rec audit.Record) (uint64, error)
	// AppendLazy writes rec with the next batch without waiting (outcome records).
	AppendLazy(ctx context.Context, rec audit.Record) error
}

// Grant is one identity with its policy.
type Grant struct {
	Name string
	// TokenSHA256 is the lowercase hex SHA-256 of the grant's HTTP bearer
	// token; empty means the grant cannot use HTTP.
	TokenSHA256 string
	// Policy decides the grant's calls; nil means the grant can do nothing.
	Policy *policy.Engine
	// VMs are path.Match globs over VM ids ("lab/*"); empty means every VM.
	VMs []string
	// RequestsPerMinute overrides HTTPOptions.RequestsPerMinute for this
	// grant (0: the server's).
	RequestsPerMinute int
}

// Backend is one hypervisor driver and the name its VM ids start with.
type Backend struct {
	Name   string
	Driver hypervisor.Driver
}

// HTTPOptions configure Handler.
type HTTPOptions struct {
	// AllowedOrigins are the Origin values (scheme://host[:port]) a browser
	// may send besides loopback origins on a loopback address
	// (originAllowed, httpguard.go); a request with any other Origin gets
	// 403. Requests without Origin (non-browser clients) are allowed.
	AllowedOrigins []string
	// AllowedHosts are the Host header values accepted besides loopback
	// names (localhost, 127.0.0.1, [::1]) with any port; others get 403.
	AllowedHosts []string
	// Sessions bound the HTTP sessions (httpsessions.go).
	Sessions HTTPSessionLimits
	// RequestsPerMinute is each grant's request budget (httpbudget.go;
	// default DefaultHTTPRequestsPerMinute); Grant.RequestsPerMinute
	// overrides it.
	RequestsPerMinute int
	// BodyTimeout bounds how long a client takes to send a request body
	// (default DefaultBodyTimeout).
	BodyTimeout time.Duration
	// BodyBytes and BodyBytesPerGrant bound the request bodies held in
	// memory at once, in all and per grant (httpbody.go; defaults
	// DefaultHTTPBodyBytes, DefaultHTTPBodyBytesPerGrant; both at least
	// the largest body a message may have).
	BodyBytes, BodyBytesPerGrant int64
}

// Config is what New needs. Store, Audit and at least one grant are required.
type Config struct {
	Grants   []Grant
	Backends []Backend
	Store    store.Store
	Audit    Auditor
	Limits   Limits
	HTTP     HTTPOptions
	// StdioGrant is the grant ServeStdio serves as (default "local").
	StdioGrant string
	Logger     *slog.Logger     // default slog.Default()
	Now        func() time.Time // default time.Now
	// Sessions, GuestBinaries and ReapEvery configure the session and
	// process tools (see guest.go and tool_sessions.go).
	Sessions      store.Sessions
	GuestBinaries guestctl.Binaries
	ReapEvery     time.Duration
	// Templates are what vm_create makes VMs from (tool_lifecycle.go);
	// each names one of Backends. Leases keeps the created VMs' leases
	// (default: Store, when it keeps leases); without it vm_create refuses.
	// LeaseReapEvery is how often the lease reaper runs (default
	// DefaultLeaseReapEvery).
	Templates      []config.Template
	Leases         store.Leases
	LeaseReapEvery time.Duration
	// Snapshots keeps who made each snapshot (snapowners.go; default:
	// Store, when it keeps them, else memory).
	Snapshots store.Snapshots
	// AuditRecords reads the audit log's records in order; `vmgate undo`
	// finds a call's undo snapshot there (undo_operator.go). Nil: undo
	// refuses.
	AuditRecords func(fn func(audit.Record) error) error
}

// Server is the MCP server with its gate.
type Server struct {
	mcp      *mcpserver.MCPServer
	specs    []*toolSpec
	tools    map[string]*toolSpec
	grants   map[string]*Grant
	tokens   []tokenEntry
	backends map[string]hypervisor.Driver
	store    store.Store
	audit    Auditor
	// advances are the durable reservations read-only calls use
	// (advance.go).
	advances advanceSet
	limits   Limits
	httpOpts HTTPOptions
	log      *slog.Logger
	now      func() time.Time
	// policies holds each grant's current engine by grant name. The map is
	// fixed at New; SetPolicy swaps an engine atomically, so a call uses the
	// engine it loaded for its whole decision and a reload never tears one.
	policies map[string]*atomic.Pointer[policy.Engine]
	// progressEvery is how often a call whose client sent a progress token
	// is reported on while it runs (see progress.go).
	progressEvery time.Duration
	execs         execTable
	stdioGrant    string
	guest         *guestTools
	undo          *undoKeeper // undo snapshots (undo.go)
	snaps         *snapOwners // who made each snapshot, and the bounds (snapowners.go)
	auditRecords  func(fn func(audit.Record) error) error
	templates     map[string]*config.Template
	leases        *vmLeases // nil: no lease store
	// direct holds the calls handle runs without mcp-go (dispatch.go);
	// noDirect, set only by tests, sends every call through mcp-go.
	direct   directCalls
	noDirect bool

	// mu guards closed; calls holds every call in flight so Close can wait.
	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup
}

type tokenEntry struct {
	hash  [32]byte
	grant *Grant
}

// ErrUnknownGrant: a grant the server was not created with (ServeStdio,
// SetPolicy).
var ErrUnknownGrant = errors.New("unknown grant")

// backendName reports whether s is a valid backend name: [a-z0-9_-]{1,64}.
func backendName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// New builds a Server from cfg. It validates cfg before doing anything.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("server: new: no store")
	}
	if cfg.Audit == nil {
		return nil, errors.New("server: new: no audit log")
	}
	if len(cfg.Grants) == 0 {
		return nil, errors.New("server: new: no grants")
	}
	s := &Server{
		progressEvery: defaultProgressEvery,
		grants:        make(map[string]*Grant, len(cfg.Grants)),
		policies:      make(map[string]*atomic.Pointer[policy.Engine], len(cfg.Grants)),
		backends:      make(map[string]hypervisor.Driver, len(cfg.Backends)),
		store:         cfg.Store,
		audit:         cfg.Audit,
		limits:        cfg.Limits.withDefaults(),
		httpOpts:      cfg.HTTP,
		log:           cfg.Logger,
		now:           cfg.Now,
		stdioGrant:    cfg.StdioGrant,
	}
	if s.stdioGrant == "" {
		s.stdioGrant = "local"
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	for i := range cfg.Grants {
		g := cfg.Grants[i]
		if g.Name == "" || strings.ContainsAny(g.Name, "\x00\n") {
			return nil, fmt.Errorf("server: new: grant %d: invalid name %q", i, g.Name)
		}
		if _, dup := s.grants[g.Name]; dup {
			return nil, fmt.Errorf("server: new: grant %q defined twice", g.Name)
		}
		for _, glob := range g.VMs {
			if _, err := path.Match(glob, ""); err != nil {
				return nil, fmt.Errorf("server: new: grant %q: vms glob %q: %w", g.Name, glob, err)
			}
		}
		if g.TokenSHA256 != "" {
			h, err := hex.DecodeString(g.TokenSHA256)
			if err != nil || len(h) != 32 {
				return nil, fmt.Errorf("server: new: grant %q: token_sha256 is not 64 hex digits", g.Name)
			}
			var e tokenEntry
			copy(e.hash[:], h)
			e.grant = &g
			s.tokens = append(s.tokens, e)
		}
		s.grants[g.Name] = &g
		p := new(atomic.Pointer[policy.Engine])
		p.Store(g.Policy)
		s.policies[g.Name] = p
	}
	for _, b := range cfg.Backends {
		if !backendName(b.Name) {
			return nil, fmt.Errorf("server: new: invalid backend name %q (want [a-z0-9_-]{1,64})", b.Name)
		}
		if b.Driver == nil {
			return nil, fmt.Errorf("server: new: backend %q has no driver", b.Name)
		}
		if _, dup := s.backends[b.Name]; dup {
			return nil, fmt.Errorf("server: new: backend %q defined twice", b.Name)
		}
		s.backends[b.Name] = b.Driver
	}
	s.undo = newUndoKeeper(s)
	s.snaps = newSnapOwners(s, cfg)
	s.auditRecords = cfg.AuditRecords
	s.guest = newGuestTools(s, cfg)
	if err := s.setupLeases(cfg); err != nil {
		return nil, err
	}
	s.specs = catalogue(s.limits)
	s.tools = make(map[string]*toolSpec, len(s.specs))
	s.mcp = mcpserver.NewMCPServer(Name, Version,
		mcpserver.WithToolCapabilities(false),
		mcpserver.WithToolFilter(s.filterTools),
		mcpserver.WithInstructions("vmgate runs tools inside virtual machines. Call list_vms first; "+
			"every call is checked by a policy and audited. Errors start with a tag such as [POLICY DENIED] or [RATE LIMITED]."),
	)
	for _, spec := range s.specs {
		s.tools[spec.name] = spec
		s.mcp.AddTool(spec.mcpTool(), s.toolHandler(spec))
	}
	return s, nil
}

// MCP returns the underlying mcp-go server. Messages sent to it directly
// bypass the gate, and its tool handlers refuse every call that did.
func (s *Server) MCP() *mcpserver.MCPServer { return s.mcp }

// Close waits for the calls in flight to finish and closes every driver
// that holds connections. It does not close the store or the audit log,
// which the caller opened.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.guest.stop()
	s.calls.Wait()
	for _, a := range s.advances.retireAll() {
		s.endAdvance(a)
	}
	if s.leases != nil {
		s.leases.close()
	}
	var errs []error
	for name, d := range s.backends {
		if c, ok := d.(hypervisor.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("server: close backend %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// begin registers a call in flight; false once Close has begun.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.calls.Add(1)
	return true
}

// vmVisible reports whether grant g may see the VM id.
func (g *Grant) vmVisible(id string) bool {
	if len(g.VMs) == 0 {
		return true
	}
	return slices.ContainsFunc(g.VMs, func(glob string) bool {
		ok, _ := path.Match(glob, id)
		return ok
	})
}

// resolveVM splits a VM id and finds its backend, as grant g sees it: an
// id of another grant's VM, of an unknown backend or one validVMID refuses
// are all the same "unknown VM".
func (s *Server) resolveVM(g *Grant, id string) (backend string, name string, d hypervisor.Driver, ok bool) {
	if !validVMID(id) {
		return "", "", nil, false
	}
	backend, name, _ = strings.Cut(id, "/")
	d, ok = s.backends[backend]
	if !ok || !g.vmVisible(id) {
		return "", "", nil, false
	}
	return backend, name, d, true
}

// policyOf returns g's current policy engine; nil means g can do nothing.
func (s *Server) policyOf(g *Grant) *policy.Engine {
	if p := s.policies[g.Name]; p != nil {
		return p.Load()
	}
	return nil
}

// SetPolicy replaces grant's policy engine (a reload). Calls already past
// their decision keep the engine they used; counters live in the store and
// carry over. A nil engine is refused: a reload never leaves a grant
// without a policy by accident.
func (s *Server) SetPolicy(grant string, eng *policy.Engine) error {
	p := s.policies[grant]
	if p == nil {
		return fmt.Errorf("server: set policy: %w %q", ErrUnknownGrant, grant)
	}
	if eng == nil {
		return fmt.Errorf("server: set policy of %q: nil engine", grant)
	}
	p.Store(eng)
	return nil
}
