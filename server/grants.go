package server

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// Grants: who may call, with which policy, seeing which VMs; how a VM id
// resolves for a grant; and the gate as its tools' catalog.Decider.

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
	// RequestsPerMinute overrides the HTTP transport's request budget
	// (mcphttp.Options.RequestsPerMinute) for this grant (0: the server's).
	RequestsPerMinute int
}

// Backend is one hypervisor driver and the name its VM ids start with.
type Backend struct {
	Name   string
	Driver hypervisor.Driver
}

type tokenEntry struct {
	hash  [32]byte
	grant *Grant
}

// callGrant is g as a tool handler sees it.
func (g *Grant) callGrant() catalog.Grant { return catalog.Grant{Name: g.Name, VMs: g.VMs} }

// resolveVM splits a VM id and finds its backend, as grant g sees it: an
// id of another grant's VM, of an unknown backend or one catalog.ValidVMID
// refuses are all the same "unknown VM".
func (s *Server) resolveVM(g *Grant, id string) (backend string, name string, d hypervisor.Driver, ok bool) {
	if !catalog.ValidVMID(id) {
		return "", "", nil, false
	}
	backend, name, _ = strings.Cut(id, "/")
	d, ok = s.backends[backend]
	if !ok || !g.callGrant().Sees(id) {
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

// Policy returns grant's policy engine in force now (after any reload);
// nil for an unknown grant. The operator page compares it with a
// suggested one.
func (s *Server) Policy(grant string) *policy.Engine {
	if g := s.grants[grant]; g != nil {
		return s.policyOf(g)
	}
	return nil
}

// SetPolicy replaces grant's policy engine (a reload). Calls already past
// their decision keep the engine they used; counters live in the store and
// carry over. The grant's sessions are told (events.go: policy_reloaded,
// and tools/list_changed when what tools/list shows them changed). A nil engine is refused: a reload never leaves a grant
// without a policy by accident.
func (s *Server) SetPolicy(grant string, eng *policy.Engine) error {
	p := s.policies[grant]
	if p == nil {
		return fmt.Errorf("server: set policy: %w %q", ErrUnknownGrant, grant)
	}
	if eng == nil {
		return fmt.Errorf("server: set policy of %q: nil engine", grant)
	}
	old := p.Swap(eng)
	s.notifyPolicy(grant, old, eng)
	return nil
}

// redecider is the gate as its tools' catalog.Decider: a grant's current
// policy, asked again about a call.
type redecider struct{ s *Server }

func (r redecider) Decide(c *catalog.Call, args map[string]any) (policy.Decision, bool) {
	g := r.s.grants[c.Grant.Name]
	if g == nil {
		return policy.Decision{}, false
	}
	eng := r.s.policyOf(g)
	if eng == nil {
		return policy.Decision{}, false
	}
	return eng.Decide(policy.Call{Grant: c.Grant.Name, Transport: c.Transport, Tool: c.Tool, VM: c.VM, Args: args}), true
}
