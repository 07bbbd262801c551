package archtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// The dependency test keeps the arrows of docs/design.md ("Layout") pointing
// down. It lists the module's packages with `go list` and checks each rule
// below against their imports (direct) or dependencies (transitive,
// non-test).

const module = "github.com/vmgate/vmgate"

// listedPackage is the part of `go list -json` output the rules read.
type listedPackage struct {
	ImportPath string
	Imports    []string // direct imports of the non-test files
	Deps       []string // transitive dependencies of the non-test files
	Error      *struct{ Err string }
}

// depRule is one arrow constraint. Paths handed to its functions are
// relative to the module ("policy", "plugins/qemu"; "." for the root) when
// the package is ours, and full import paths otherwise.
type depRule struct {
	name string
	// applies reports whether the rule constrains our package pkg.
	applies func(pkg string) bool
	// transitive checks every dependency, not only direct imports.
	transitive bool
	// forbidden reports whether a constrained package may not depend on dep.
	forbidden func(dep string, ours bool) bool
}

// ours returns path relative to the module and whether it is in the module.
func ours(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	if rel, ok := strings.CutPrefix(path, module+"/"); ok {
		return rel, true
	}
	return path, false
}

// standard reports whether path, a full import path not of ours, is a
// standard-library package: its first element has no dot (the go command's
// own convention). A relative path of ours has no dot either: check ours first.
func standard(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// within reports whether rel is dir or inside it.
func within(rel, dir string) bool {
	return rel == dir || strings.HasPrefix(rel, dir+"/")
}

// transports are the packages that serve MCP to clients: only the binary
// wires them up.
var transports = []string{"server/stdio", "server/mcphttp", "server/operator"}

func transport(rel string) bool { return slices.Contains(transports, rel) }

const (
	transportRule  = "only cmd/vmgate imports a transport (server/stdio, server/mcphttp, server/operator)"
	catalogRule    = "the tool side (server/catalog, server/tools, server/lease) imports neither the gate (server) nor a transport"
	jsonrpcRule    = "server/jsonrpc imports neither the gate (server) nor a transport"
	mcpgoRule      = "no package but server (and its subpackages), cmd/vmgate and internal/mcpcall imports mcp-go"
	argviewRule    = "server/argview imports only the standard library"
	strictjsonRule = "internal/strictjson (the leaf policy may import) imports only the standard library"
	auditRule      = "policy/audit imports only the standard library and policy (its counters are the policy's)"
	muxRule        = "guest/mux (the helper's framing, shared by drivers and the guest) imports only the standard library"
	guestRule      = "nothing under guest/ imports hypervisor (host-side code such as internal/guestctl lives on the host side)"
)

var depRules = []depRule{
	{
		name:       "policy imports only the standard library and, of ours, the strict JSON lexer",
		applies:    func(pkg string) bool { return pkg == "policy" },
		transitive: true,
		forbidden: func(dep string, ours bool) bool {
			return ours && dep != "internal/strictjson" || !ours && !standard(dep)
		},
	},
	{
		name: mcpgoRule,
		applies: func(pkg string) bool {
			return !within(pkg, "server") && pkg != "cmd/vmgate" && pkg != "internal/mcpcall"
		},
		forbidden: func(dep string, ours bool) bool {
			return !ours && within(dep, "github.com/mark3labs/mcp-go")
		},
	},
	{
		name:       "no package under plugins/ imports server or policy",
		applies:    func(pkg string) bool { return within(pkg, "plugins") },
		transitive: true,
		forbidden: func(dep string, ours bool) bool {
			return ours && (within(dep, "server") || within(dep, "policy"))
		},
	},
	{
		name:       "guest/qga imports only the standard library",
		applies:    func(pkg string) bool { return pkg == "guest/qga" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours || !standard(dep) },
	},
	{
		name:       "hypervisor imports no package of ours outside hypervisor/",
		applies:    func(pkg string) bool { return pkg == "hypervisor" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && !within(dep, "hypervisor") },
	},
	{
		name:       argviewRule,
		applies:    func(pkg string) bool { return pkg == "server/argview" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours || !standard(dep) },
	},
	{
		name:       strictjsonRule,
		applies:    func(pkg string) bool { return pkg == "internal/strictjson" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours || !standard(dep) },
	},
	{
		name:       auditRule,
		applies:    func(pkg string) bool { return pkg == "policy/audit" },
		transitive: true,
		forbidden: func(dep string, ours bool) bool {
			return ours && dep != "policy" && dep != "internal/strictjson" || !ours && !standard(dep)
		},
	},
	{
		name:       transportRule,
		applies:    func(pkg string) bool { return pkg != "cmd/vmgate" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && transport(dep) },
	},
	{
		name: catalogRule,
		applies: func(pkg string) bool {
			return within(pkg, "server/catalog") || within(pkg, "server/tools") || within(pkg, "server/lease")
		},
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && (dep == "server" || transport(dep)) },
	},
	{
		name:       jsonrpcRule,
		applies:    func(pkg string) bool { return pkg == "server/jsonrpc" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && (dep == "server" || transport(dep)) },
	},
	{
		name:       guestRule,
		applies:    func(pkg string) bool { return within(pkg, "guest") },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours && within(dep, "hypervisor") },
	},
	{
		name:       muxRule,
		applies:    func(pkg string) bool { return pkg == "guest/mux" },
		transitive: true,
		forbidden:  func(dep string, ours bool) bool { return ours || !standard(dep) },
	},
	{
		name: "the offline policy tools (policy/suggest, diff, replay) import only the standard library and, of ours, policy/... and the strict JSON lexer: the server's catalogue comes in as data",
		applies: func(pkg string) bool {
			return pkg == "policy/suggest" || pkg == "policy/diff" || pkg == "policy/replay"
		},
		transitive: true,
		forbidden: func(dep string, ours bool) bool {
			return ours && !within(dep, "policy") && dep != "internal/strictjson" || !ours && !standard(dep)
		},
	},
}

// violations checks pkgs against rules. It returns one line per forbidden
// dependency, and in applied how many packages each rule constrained.
func violations(pkgs []listedPackage, rules []depRule) (found []string, applied map[string]int) {
	applied = map[string]int{}
	for _, p := range pkgs {
		rel, isOurs := ours(p.ImportPath)
		if !isOurs {
			continue
		}
		for _, r := range rules {
			if !r.applies(rel) {
				continue
			}
			applied[r.name]++
			deps := p.Imports
			if r.transitive {
				deps = p.Deps
			}
			for _, d := range deps {
				drel, dOurs := ours(d)
				if r.forbidden(drel, dOurs) {
					found = append(found, fmt.Sprintf("%s: %s depends on %s", r.name, rel, d))
				}
			}
		}
	}
	return found, applied
}

func listModule(t *testing.T) []listedPackage {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("deps: the go command is needed to list the module: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, gocmd, "list", "-e", "-json=ImportPath,Imports,Deps,Error", module+"/...")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("deps: go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("deps: decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestDependencyArrows(t *testing.T) {
	pkgs := listModule(t)
	if len(pkgs) == 0 {
		t.Fatal("deps: go list found no packages")
	}
	for _, p := range pkgs {
		// A package that does not load has an incomplete import list: the
		// rules cannot vouch for it, so that is a failure, not a pass.
		if p.Error != nil {
			t.Errorf("deps: %s does not load, its imports cannot be checked: %s", p.ImportPath, p.Error.Err)
		}
	}
	found, applied := violations(pkgs, depRules)
	for _, v := range found {
		t.Error(v)
	}
	for _, r := range depRules {
		if applied[r.name] == 0 {
			t.Errorf("rule %q constrains no package of the module; want at least one (a renamed package makes a rule vacuous)", r.name)
		}
	}
}

// TestDependencyRulesBite feeds the rules synthetic import graphs that break
// each one, and a clean graph shaped like the Layout.
func TestDependencyRulesBite(t *testing.T) {
	m := func(rel string) string { return module + "/" + rel }
	clean := []listedPackage{
		{ImportPath: m("policy"), Imports: []string{"encoding/json", m("internal/strictjson")}, Deps: []string{"encoding/json", m("internal/strictjson")}},
		{ImportPath: m("internal/strictjson"), Imports: []string{"unicode/utf8"}, Deps: []string{"unicode/utf8"}},
		{ImportPath: m("policy/store"), Imports: []string{m("policy"), "go.etcd.io/bbolt"}, Deps: []string{m("policy"), "go.etcd.io/bbolt"}},
		{ImportPath: m("guest/qga"), Imports: []string{"net"}, Deps: []string{"net", "syscall"}},
		{ImportPath: m("guest/agent"), Imports: []string{m("guest/agent/wire")}, Deps: []string{m("guest/agent/wire"), "golang.org/x/sys/unix"}},
		{ImportPath: m("hypervisor"), Imports: []string{"context", m("hypervisor/proto")}, Deps: []string{"context", m("hypervisor/proto"), "google.golang.org/grpc"}},
		{ImportPath: m("plugins/qemu"), Imports: []string{m("hypervisor"), m("guest/qga")}, Deps: []string{m("hypervisor"), m("guest/qga"), "context"}},
		{ImportPath: m("server"), Imports: []string{"github.com/mark3labs/mcp-go/server", m("policy")}, Deps: []string{"github.com/mark3labs/mcp-go/server", m("policy")}},
		{ImportPath: m("server/auth"), Imports: []string{"github.com/mark3labs/mcp-go/mcp"}},
		{ImportPath: m("cmd/vmgate"), Imports: []string{m("server"), m("server/stdio"), "github.com/mark3labs/mcp-go/mcp"},
			Deps: []string{m("server"), m("server/stdio"), m("server/catalog")}},
		{ImportPath: m("server/stdio"), Imports: []string{m("server")}, Deps: []string{m("server"), m("server/catalog"), m("server/jsonrpc")}},
		{ImportPath: m("server/catalog"), Imports: []string{m("server/lease")}, Deps: []string{m("server/lease"), m("policy")}},
		{ImportPath: m("server/jsonrpc"), Imports: []string{m("internal/strictjson")}, Deps: []string{m("internal/strictjson")}},
		{ImportPath: m("internal/mcpcall"), Imports: []string{"github.com/mark3labs/mcp-go/client"}, Deps: []string{m("server/jsonrpc")}},
		// Not ours: the rules do not constrain other modules.
		{ImportPath: "github.com/mark3labs/mcp-go/server", Imports: []string{"github.com/vmgate/vmgate/policy"}},
	}
	tests := []struct {
		name     string
		pkg      listedPackage
		wantRule string // the rule that must report it; "" for none
	}{
		{"policy imports policy/store", listedPackage{ImportPath: m("policy"), Imports: []string{m("policy/store")}, Deps: []string{m("policy/store")}}, depRules[0].name},
		{"policy depends on a third party transitively", listedPackage{ImportPath: m("policy"), Imports: []string{"fmt"}, Deps: []string{"fmt", "gopkg.in/yaml.v3"}}, depRules[0].name},
		{"policy/store may import policy", listedPackage{ImportPath: m("policy/store"), Imports: []string{m("policy")}, Deps: []string{m("policy")}}, ""},
		{"policy may import the strict JSON lexer", listedPackage{ImportPath: m("policy"), Imports: []string{m("internal/strictjson")}, Deps: []string{m("internal/strictjson"), "strings"}}, ""},
		{"policy imports another internal package", listedPackage{ImportPath: m("policy"), Imports: []string{m("internal/strictjsonx")}, Deps: []string{m("internal/strictjsonx")}}, depRules[0].name},
		{"policy reaches a third party through the lexer", listedPackage{ImportPath: m("policy"), Imports: []string{m("internal/strictjson")}, Deps: []string{m("internal/strictjson"), "github.com/x/y"}}, depRules[0].name},
		{"the strict JSON lexer imports policy", listedPackage{ImportPath: m("internal/strictjson"), Imports: []string{m("policy")}, Deps: []string{m("policy")}}, strictjsonRule},
		{"policy/audit imports policy", listedPackage{ImportPath: m("policy/audit"), Imports: []string{m("policy")}, Deps: []string{m("policy"), m("internal/strictjson")}}, ""},
		{"policy/audit imports policy/store", listedPackage{ImportPath: m("policy/audit"), Imports: []string{m("policy/store")}, Deps: []string{m("policy/store"), m("policy")}}, auditRule},
		{"guest code imports hypervisor", listedPackage{ImportPath: m("guest/helper"), Imports: []string{m("hypervisor")}, Deps: []string{m("hypervisor")}}, guestRule},
		{"the guest agent reaches hypervisor transitively", listedPackage{ImportPath: m("guest/agent"), Imports: []string{m("guest/agent/wire")}, Deps: []string{m("guest/agent/wire"), m("hypervisor/proto")}}, guestRule},
		{"host-side guest control imports hypervisor", listedPackage{ImportPath: m("internal/guestctl"), Imports: []string{m("hypervisor"), m("guest/agent/wire")}, Deps: []string{m("hypervisor"), m("guest/agent/wire")}}, ""},
		{"the strict JSON lexer depends on a third party", listedPackage{ImportPath: m("internal/strictjson"), Imports: []string{"strings"}, Deps: []string{"strings", "golang.org/x/text"}}, strictjsonRule},
		{"plugin imports mcp-go", listedPackage{ImportPath: m("plugins/proxmox"), Imports: []string{"github.com/mark3labs/mcp-go/mcp"}}, mcpgoRule},
		{"policy/audit imports mcp-go", listedPackage{ImportPath: m("policy/audit"), Imports: []string{"github.com/mark3labs/mcp-go"}}, mcpgoRule},
		{"a package named like server imports mcp-go", listedPackage{ImportPath: m("serverless"), Imports: []string{"github.com/mark3labs/mcp-go/server"}}, mcpgoRule},
		{"another internal package imports mcp-go", listedPackage{ImportPath: m("internal/mcpcallx"), Imports: []string{"github.com/mark3labs/mcp-go/client"}}, mcpgoRule},
		{"the gate imports a transport", listedPackage{ImportPath: m("server"), Imports: []string{m("server/stdio")}, Deps: []string{m("server/stdio")}}, transportRule},
		{"e2e reaches a transport through a helper", listedPackage{ImportPath: m("e2e/helper"), Imports: []string{m("internal/x")}, Deps: []string{m("internal/x"), m("server/mcphttp")}}, transportRule},
		{"the ui imports the operator socket", listedPackage{ImportPath: m("server/ui"), Imports: []string{m("server/operator")}, Deps: []string{m("server/operator")}}, transportRule},
		{"a transport's test helper is no transport", listedPackage{ImportPath: m("server/servertest"), Imports: []string{m("server")}, Deps: []string{m("server"), m("server/catalog")}}, ""},
		{"the catalogue imports the gate", listedPackage{ImportPath: m("server/catalog"), Imports: []string{m("server")}, Deps: []string{m("server")}}, catalogRule},
		{"a tool family reaches the gate", listedPackage{ImportPath: m("server/tools"), Imports: []string{m("server/catalog")}, Deps: []string{m("server/catalog"), m("server")}}, catalogRule},
		{"the lease keeper reaches the gate", listedPackage{ImportPath: m("server/lease"), Imports: []string{m("internal/x")}, Deps: []string{m("internal/x"), m("server")}}, catalogRule},
		{"the tools may import the catalogue", listedPackage{ImportPath: m("server/tools"), Imports: []string{m("server/catalog")}, Deps: []string{m("server/catalog"), m("server/lease")}}, ""},
		{"jsonrpc imports the gate", listedPackage{ImportPath: m("server/jsonrpc"), Imports: []string{m("server")}, Deps: []string{m("server")}}, jsonrpcRule},
		{"jsonrpc reaches the gate", listedPackage{ImportPath: m("server/jsonrpc"), Imports: []string{m("internal/x")}, Deps: []string{m("internal/x"), m("server")}}, jsonrpcRule},
		{"an mcp-go look-alike is not mcp-go", listedPackage{ImportPath: m("internal/x"), Imports: []string{"github.com/mark3labs/mcp-golang"}}, ""},
		{"mcp-go through server is not a direct import", listedPackage{ImportPath: m("e2e"), Imports: []string{m("server")}, Deps: []string{m("server"), "github.com/mark3labs/mcp-go/mcp"}}, ""},
		{"plugin imports server", listedPackage{ImportPath: m("plugins/libvirt"), Imports: []string{m("server")}, Deps: []string{m("server")}}, depRules[2].name},
		{"plugin depends on policy/store transitively", listedPackage{ImportPath: m("plugins/virtualbox"), Imports: []string{m("internal/util")}, Deps: []string{m("internal/util"), m("policy/store")}}, depRules[2].name},
		{"guest/qga imports another package of ours", listedPackage{ImportPath: m("guest/qga"), Imports: []string{m("guest/agent/wire")}, Deps: []string{m("guest/agent/wire")}}, depRules[3].name},
		{"guest/qga depends on a third party", listedPackage{ImportPath: m("guest/qga"), Imports: []string{"net"}, Deps: []string{"net", "golang.org/x/sys/unix"}}, depRules[3].name},
		{"hypervisor imports guest/qga", listedPackage{ImportPath: m("hypervisor"), Imports: []string{m("guest/qga")}, Deps: []string{m("guest/qga")}}, depRules[4].name},
		{"hypervisor depends on policy through proto", listedPackage{ImportPath: m("hypervisor"), Imports: []string{m("hypervisor/proto")}, Deps: []string{m("hypervisor/proto"), m("policy")}}, depRules[4].name},
		{"server/argview imports policy/store", listedPackage{ImportPath: m("server/argview"), Imports: []string{m("policy/store")}, Deps: []string{m("policy/store"), m("policy")}}, argviewRule},
		{"guest/mux imports the agent's wire types", listedPackage{ImportPath: m("guest/mux"), Imports: []string{m("guest/agent/wire")}, Deps: []string{m("guest/agent/wire")}}, muxRule},
		{"guest/mux depends on a third party", listedPackage{ImportPath: m("guest/mux"), Imports: []string{"io"}, Deps: []string{"io", "golang.org/x/sys/unix"}}, muxRule},
		{"server/argview depends on mcp-go", listedPackage{ImportPath: m("server/argview"), Imports: []string{"strings"}, Deps: []string{"strings", "github.com/mark3labs/mcp-go/mcp"}}, argviewRule},
	}
	if found, _ := violations(clean, depRules); len(found) != 0 {
		t.Fatalf("violations(clean graph) = %q; want none", found)
	}
	for _, tt := range tests {
		graph := append(slices.Clone(clean), tt.pkg)
		found, _ := violations(graph, depRules)
		var got []string
		for _, v := range found {
			rule, _, _ := strings.Cut(v, ": ")
			got = append(got, rule)
		}
		var want []string
		if tt.wantRule != "" {
			want = []string{tt.wantRule}
		}
		if !slices.Equal(slices.Compact(got), want) {
			t.Errorf("violations(clean + %s) = %q; want rules %q", tt.name, found, want)
		}
	}
}
