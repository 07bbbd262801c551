// Package server is vmgate's gate: the one chokepoint every MCP message
// passes before anything reaches a hypervisor. It reads every message
// strictly (server/jsonrpc), runs a tools/call through seven named steps
// (gate.go: decode, validate, resolve, decide, approve, reserve, record),
// makes decisions durable (durability.go, advance.go), parks calls for an
// operator or asks the client's user (park.go, elicit.go), takes undo
// snapshots (undo.go), and hands a call that passed to its tool's handler
// with a single-use ticket (ticket.go). docs/design.md describes the
// whole.
//
// # The rooms around it
//
// The tools live in server/tools on the contract of server/catalog: a
// handler gets a catalog.Env and a catalog.Call, never the Server. The
// transports (server/stdio, server/mcphttp, server/operator) import this
// package and use its transport API (transport.go: Conn, Handle, Admit,
// Grant, GrantForToken); only cmd/vmgate imports them.
//
// mcp-go validates arguments and filters tools before any tool middleware
// runs, so a gate written as middleware would not see unknown tools or
// malformed arguments. The gate therefore sits in front of mcp-go at the
// JSON-RPC message level: a message that fails strict decoding never
// reaches mcp-go, and a tools/call reaches its handler only with the
// ticket the gate put in its context for exactly that call, with the
// arguments the gate checked, not with mcp-go's own decoding.
//
// # Concurrency
//
// A Server is safe for concurrent use; its transports serve calls
// concurrently. Grants, backends, the catalogue and the Env are immutable
// after New; a grant's policy is swapped atomically (SetPolicy).
package server

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path"
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
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/lease"
	"github.com/vmgate/vmgate/server/tools"
)

// Name is what the server reports in initialize.
const Name = "vmgate"

// The tags every error result starts with (catalog's).
const (
	TagDenied      = catalog.TagDenied
	TagRateLimited = catalog.TagRateLimited
	TagApproval    = catalog.TagApproval
	TagInvalid     = catalog.TagInvalid
	TagUnknownVM   = catalog.TagUnknownVM
	TagBackend     = catalog.TagBackend
	TagTimedOut    = catalog.TagTimedOut
	TagQuota       = catalog.TagQuota
)

// Auditor is the audit log as the gate uses it; *audit.Log implements it.
type Auditor interface {
	// Append writes rec and returns once it is durable (decision records).
	Append(ctx context.Context, rec audit.Record) (uint64, error)
	// AppendLazy writes rec with the next batch without waiting (outcome records).
	AppendLazy(ctx context.Context, rec audit.Record) error
}

// Config is what New needs. Store, Audit and at least one grant are required.
type Config struct {
	Grants   []Grant
	Backends []Backend
	Store    store.Store
	Audit    Auditor
	Limits   catalog.Limits
	// Timeouts bound each call by what it does (zero values: the defaults,
	// catalog.DefaultTimeouts).
	Timeouts catalog.Timeouts
	// Version is what initialize reports (default "dev").
	Version string
	// ShutdownGrace is how long ServeStdio lets calls in flight finish
	// after its context ends or its input closes, before it cancels them
	// (default DefaultShutdownGrace).
	ShutdownGrace time.Duration
	Logger        *slog.Logger     // default slog.Default()
	Now           func() time.Time // default time.Now
	// Sessions, GuestBinaries and ReapEvery configure the session and
	// process tools (catalog/guest.go, tools/sessions.go; the reaper in
	// reaper.go).
	Sessions      store.Sessions
	GuestBinaries guestctl.Binaries
	ReapEvery     time.Duration
	// Templates are what vm_create makes VMs from (tools/lifecycle.go);
	// each names one of Backends. Leases keeps the created VMs' leases
	// (default: Store, when it keeps leases); without it vm_create refuses.
	// LeaseReapEvery is how often the lease reaper runs (default
	// DefaultLeaseReapEvery).
	Templates      []config.Template
	Leases         store.Leases
	LeaseReapEvery time.Duration
	// Snapshots keeps who made each snapshot (catalog/snapowners.go; default:
	// Store, when it keeps them, else memory).
	Snapshots store.Snapshots
	// AuditRecords reads the audit log's records in order; `vmgate undo`
	// finds a call's undo snapshot there (undo_operator.go). Nil: undo
	// refuses.
	AuditRecords func(fn func(audit.Record) error) error
}

// Server is the MCP server with its gate.
type Server struct {
	mcp   *mcpserver.MCPServer
	specs []*catalog.Tool
	tools map[string]*catalog.Tool
	// env is what every tool handler gets besides its call.
	env      *catalog.Env
	grants   map[string]*Grant
	tokens   []tokenEntry
	backends map[string]hypervisor.Driver
	store    store.Store
	audit    Auditor
	// advances are the durable reservations read-only calls use
	// (advance.go).
	advances advanceSet
	limits   catalog.Limits
	// grace is Config.ShutdownGrace.
	grace time.Duration
	log   *slog.Logger
	now   func() time.Time
	// policies holds each grant's current engine by grant name. The map is
	// fixed at New; SetPolicy swaps an engine atomically, so a call uses the
	// engine it loaded for its whole decision and a reload never tears one.
	policies map[string]*atomic.Pointer[policy.Engine]
	// progressEvery is how often a call whose client sent a progress token
	// is reported on while it runs (see progress.go).
	progressEvery time.Duration
	undo          *undoKeeper   // undo snapshots (undo.go)
	elicitStates  *elicitStates // the client approvals' request states (elicit.go)
	reaper        *reaper       // sessions and undo snapshots past their time (reaper.go)
	auditRecords  func(fn func(audit.Record) error) error
	templates     map[string]*config.Template
	leases        *lease.Keeper // nil: no lease store
	// direct holds the calls handle runs without mcp-go (dispatch.go);
	// noDirect, set only by tests, sends every call through mcp-go.
	direct   directCalls
	noDirect bool
	// notify holds the sessions the transports attached, which the
	// server's notifications go to (notify.go, events.go).
	notify notifier

	// mu guards closed; calls holds every call in flight so Close can wait.
	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup
}

// ErrUnknownGrant: a grant the server was not created with (ServeStdio,
// SetPolicy).
var ErrUnknownGrant = errors.New("unknown grant")

// DefaultShutdownGrace is Config.ShutdownGrace when it is not set.
const DefaultShutdownGrace = 10 * time.Second

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
	s := newServer(cfg)
	for _, step := range []func(Config) error{s.setupGrants, s.setupBackends, s.setupLeases} {
		if err := step(cfg); err != nil {
			return nil, err
		}
	}
	s.setupTools(cfg)
	s.setupMCP(cfg.Version)
	s.watchProcesses()
	s.reaper = startReaper(s, cfg.ReapEvery)
	return s, nil
}

// newServer is s with cfg's plain settings and their defaults.
func newServer(cfg Config) *Server {
	s := &Server{
		progressEvery: defaultProgressEvery,
		grants:        make(map[string]*Grant, len(cfg.Grants)),
		policies:      make(map[string]*atomic.Pointer[policy.Engine], len(cfg.Grants)),
		backends:      make(map[string]hypervisor.Driver, len(cfg.Backends)),
		store:         cfg.Store,
		audit:         cfg.Audit,
		limits:        cfg.Limits.WithDefaults(),
		grace:         cfg.ShutdownGrace,
		log:           cfg.Logger,
		now:           cfg.Now,
		auditRecords:  cfg.AuditRecords,
		elicitStates:  newElicitStates(),
	}
	if s.grace <= 0 {
		s.grace = DefaultShutdownGrace
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// setupGrants checks and keeps cfg's grants, their tokens and policies.
func (s *Server) setupGrants(cfg Config) error {
	for i := range cfg.Grants {
		g := cfg.Grants[i]
		if g.Name == "" || strings.ContainsAny(g.Name, "\x00\n") {
			return fmt.Errorf("server: new: grant %d: invalid name %q", i, g.Name)
		}
		if _, dup := s.grants[g.Name]; dup {
			return fmt.Errorf("server: new: grant %q defined twice", g.Name)
		}
		for _, glob := range g.VMs {
			if _, err := path.Match(glob, ""); err != nil {
				return fmt.Errorf("server: new: grant %q: vms glob %q: %w", g.Name, glob, err)
			}
		}
		if g.TokenSHA256 != "" {
			h, err := hex.DecodeString(g.TokenSHA256)
			if err != nil || len(h) != 32 {
				return fmt.Errorf("server: new: grant %q: token_sha256 is not 64 hex digits", g.Name)
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
	return nil
}

// setupBackends checks and keeps cfg's backends.
func (s *Server) setupBackends(cfg Config) error {
	for _, b := range cfg.Backends {
		if !config.ValidBackendName(b.Name) {
			return fmt.Errorf("server: new: invalid backend name %q (want %s)", b.Name, config.BackendNameRule)
		}
		if b.Driver == nil {
			return fmt.Errorf("server: new: backend %q has no driver", b.Name)
		}
		if _, dup := s.backends[b.Name]; dup {
			return fmt.Errorf("server: new: backend %q defined twice", b.Name)
		}
		s.backends[b.Name] = b.Driver
	}
	return nil
}

// setupTools builds the catalogue and what its handlers share (the Env):
// the guest helpers with the session store, the snapshot owners and the
// undo keeper.
func (s *Server) setupTools(cfg Config) {
	sessions := cfg.Sessions
	if sessions == nil {
		if ss, ok := cfg.Store.(store.Sessions); ok {
			sessions = ss
		} else {
			s.log.Warn("server: the store keeps no sessions; they are kept in memory and a restart forgets them")
			sessions = memory.NewSessions()
		}
	}
	snaps := cfg.Snapshots
	if snaps == nil {
		if ss, ok := cfg.Store.(store.Snapshots); ok {
			snaps = ss
		} else {
			s.log.Warn("server: the store keeps no snapshot owners; they are kept in memory and a restart forgets them")
			snaps = memory.NewSnapshots()
		}
	}
	s.undo = newUndoKeeper(s)
	s.env = &catalog.Env{
		Limits: s.limits, Timeouts: cfg.Timeouts.WithDefaults(), Now: s.now, Log: s.log,
		Backends: s.backends, Execs: &catalog.ExecTable{}, Leases: s.leases, Templates: s.templates,
		Guest:     catalog.NewGuest(sessions, cfg.GuestBinaries, s.backends, s.now, s.log),
		Snapshots: catalog.NewSnapOwners(snaps, s.now, s.log, s.undo.forgetPruned),
		Policy:    redecider{s},
	}
	s.specs = tools.Catalogue(s.limits)
	s.tools = make(map[string]*catalog.Tool, len(s.specs))
	for _, t := range s.specs {
		s.tools[t.Name] = t
	}
}

// setupMCP makes the mcp-go server that serves everything but the gated
// calls' handlers, with every tool registered.
func (s *Server) setupMCP(version string) {
	if version == "" {
		version = "dev"
	}
	s.mcp = mcpserver.NewMCPServer(Name, version,
		// tools.listChanged: a policy reload that changes what a grant
		// sees tells its sessions (events.go).
		mcpserver.WithToolCapabilities(true),
		mcpserver.WithLogging(),
		mcpserver.WithToolFilter(s.filterTools),
		mcpserver.WithInstructions("vmgate runs tools inside virtual machines. Call list_vms first; "+
			"every call is checked by a policy and audited. Errors start with a tag such as [POLICY DENIED] or [RATE LIMITED]."),
	)
	for _, t := range s.specs {
		s.mcp.AddTool(t.MCPTool(), s.toolHandler(t))
	}
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
	s.reaper.stop()
	s.calls.Wait()
	for _, a := range s.advances.retireAll() {
		s.endAdvance(a)
	}
	if s.leases != nil {
		s.leases.Close()
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

// setupLeases takes cfg's templates and lease store and starts the lease
// reaper. Every template must name a backend of cfg.
func (s *Server) setupLeases(cfg Config) error {
	s.templates = make(map[string]*config.Template, len(cfg.Templates))
	for i := range cfg.Templates {
		t := &cfg.Templates[i]
		if _, ok := s.backends[t.Backend]; !ok {
			return fmt.Errorf("server: new: template %q names backend %q, which the server does not have", t.Name, t.Backend)
		}
		if _, dup := s.templates[t.Name]; dup {
			return fmt.Errorf("server: new: template %q defined twice", t.Name)
		}
		s.templates[t.Name] = t
	}
	ls := cfg.Leases
	if ls == nil {
		ls, _ = cfg.Store.(store.Leases)
	}
	if ls == nil {
		return nil
	}
	s.leases = lease.New(lease.Options{
		Store: ls, Templates: s.templates, Now: s.now, Log: s.log, Every: cfg.LeaseReapEvery,
		OnEnd: s.notifyLeaseEnded, OnEnding: s.notifyLeaseEnding,
		Creator: func(backend string) (hypervisor.Creator, bool) {
			c, ok := s.backends[backend].(hypervisor.Creator)
			return c, ok
		},
	})
	return nil
}
