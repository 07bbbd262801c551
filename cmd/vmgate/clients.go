package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newClientsCmd) }

type clientsOptions struct {
	config   string
	grant    string // "": no stdio forms (the config has no grant "local" and --grant was not given)
	httpAddr string
	tokenEnv string
	name     string
	binary   string
	// grants are the config's grants, named when grant is "".
	grants []string
	// noTokens: no grant has an HTTP token (the embedded defaults give none).
	noTokens bool
}

// fromConfig completes o from its config (the embedded defaults without
// one): the HTTP address (http.addr, unless --http was given), whether any
// grant has a token, and the stdio forms' grant. A --grant (grantSet) the
// config lacks is an error; the default "local" that it lacks leaves the
// stdio forms out.
func (o *clientsOptions) fromConfig(grantSet bool) error {
	if o.config == "" {
		o.noTokens = true
		if o.httpAddr == "" {
			o.httpAddr = defaultHTTPAddr
		}
		return nil
	}
	abs, err := filepath.Abs(o.config)
	if err != nil {
		return fmt.Errorf("clients: --config: %w", err)
	}
	o.config = abs
	cfg, err := loadConfig(o.config)
	if err != nil {
		return err
	}
	if o.httpAddr == "" {
		o.httpAddr = cmp.Or(cfg.HTTP.Addr, defaultHTTPAddr)
	}
	o.noTokens = true
	for _, g := range cfg.Grants {
		o.grants = append(o.grants, strconv.Quote(g.Name))
		if g.TokenSHA256 != "" {
			o.noTokens = false
		}
	}
	if err := checkGrant(cfg, o.config, o.grant); err != nil {
		if grantSet {
			return fmt.Errorf("clients: %w", err)
		}
		o.grant = ""
	}
	return nil
}

// defaultHTTPAddr is the address of serve --http that clients assumes
// when neither --http nor the config names one.
const defaultHTTPAddr = "127.0.0.1:8707"

func newClientsCmd() *cobra.Command {
	var o clientsOptions
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "Print ready-to-paste MCP client configurations for this setup",
		Long: `clients prints configurations for Claude Desktop, Claude Code, Cursor and the
MCP Inspector that start this vmgate over stdio, or connect to its
streamable HTTP endpoint. HTTP forms read the bearer token from an
environment variable (--token-env) instead of containing it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("clients: find the vmgate binary: %w", err)
				}
				o.binary = exe
			}
			if err := o.fromConfig(cmd.Flags().Changed("grant")); err != nil {
				return err
			}
			return writeClients(cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.config, "config", "", "config file the stdio forms pass to vmgate serve (default: embedded defaults)")
	cmd.Flags().StringVar(&o.grant, "grant", "local", "grant of the stdio forms (default local; left out when the config has no grant local)")
	cmd.Flags().StringVar(&o.httpAddr, "http", "", "address of vmgate serve --http (default: http.addr of the config, else 127.0.0.1:8707)")
	cmd.Flags().StringVar(&o.tokenEnv, "token-env", "VMGATE_TOKEN", "environment variable that holds the HTTP bearer token")
	cmd.Flags().StringVar(&o.name, "name", "vmgate", "server name in the client configurations")
	cmd.Flags().StringVar(&o.binary, "binary", "", "path of the vmgate binary (default: this one)")
	return cmd
}

var (
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	serverNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./:=@,+", c))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func jsonBlock(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// writeClients validates o and writes every snippet to w.
// inspectorPkg is the MCP Inspector the commands pin: 0.16 and later
// declare Node >= 22.7.5 (2.x: 22.19), so on Node 20 a bare npx resolves
// 0.15, which has no --header; 0.21.2's CLI mode runs on Node 20 (npm warns
// about the engine), stdio and streamable HTTP with --header alike.
const inspectorPkg = "@modelcontextprotocol/inspector@0.21.2"

func writeClients(w io.Writer, o clientsOptions) error {
	if !envNameRE.MatchString(o.tokenEnv) {
		return fmt.Errorf("clients: --token-env %q is not an environment variable name", o.tokenEnv)
	}
	if !serverNameRE.MatchString(o.name) {
		return fmt.Errorf("clients: --name %q: want letters, digits, - and _", o.name)
	}
	host, port, err := net.SplitHostPort(o.httpAddr)
	if err != nil || port == "" {
		return fmt.Errorf("clients: --http %q: want HOST:PORT", o.httpAddr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	f := clientForms{o: o, url: "http://" + net.JoinHostPort(host, port) + "/mcp", env: "$" + o.tokenEnv, bearer: "Bearer ${" + o.tokenEnv + "}"}
	f.args = []string{"serve"}
	if o.config != "" {
		f.args = append(f.args, "--config", o.config)
	}
	f.args = append(f.args, "--grant", o.grant)
	f.stdio = map[string]any{"command": o.binary, "args": f.args}
	f.header()
	f.desktop()
	f.claudeCode()
	f.cursor()
	f.inspector()
	_, err = io.WriteString(w, f.b.String())
	return err
}

// clientForms writes the snippets of writeClients.
type clientForms struct {
	o                clientsOptions
	url, env, bearer string
	args             []string       // of the stdio forms
	stdio            map[string]any // the stdio entry of a mcpServers object
	b                strings.Builder
}

func (f *clientForms) p(format string, a ...any) { fmt.Fprintf(&f.b, format, a...) }

// stdioForm writes a stdio form, or nothing when there is no grant for them.
func (f *clientForms) stdioForm(format string, a ...any) {
	if f.o.grant != "" {
		f.p(format, a...)
	}
}

// header says how the forms connect, how a grant gets an HTTP token, and
// why stdio forms are missing when they are.
func (f *clientForms) header() {
	o := f.o
	serve := []string{"vmgate", "serve"}
	if o.config != "" {
		serve = append(serve, "--config", o.config)
	}
	serve = append(serve, "--http", o.httpAddr)
	f.p("# vmgate MCP client configurations\n")
	if o.grant != "" {
		f.p("# stdio: the client starts vmgate as grant %q. ", o.grant)
	} else {
		f.p("# stdio: none here: the config has no grant \"local\"; `vmgate clients --config %s --grant NAME` prints them for one of its grants: %s.\n# ",
			shellQuote(o.config), strings.Join(o.grants, ", "))
	}
	f.p("HTTP: run `%s` and export %s=<the grant's token>.\n", shellJoin(serve), o.tokenEnv)
	if o.noTokens {
		where := "the config " + o.config
		if o.config == "" {
			where = "the embedded defaults (no --config)"
		}
		f.p("# NOTE: no grant has a token in %s, so the HTTP server refuses every request (401) until one does.\n", where)
	}
	f.p("# A grant's token: token=$(head -c 32 /dev/urandom | base64 | tr -d '/+='); printf %%s \"$token\" | sha256sum\n")
	f.p("# puts the hex to write into the grant's token_sha256 in the config (vmgate.yaml, passed with --config; the\n# embedded defaults have none); then export %s=$token.\n\n", o.tokenEnv)
}

func (f *clientForms) desktop() {
	o := f.o
	f.p("## Claude Desktop (claude_desktop_config.json)\n\n")
	f.stdioForm("### stdio\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: f.stdio}}))
	f.p("### HTTP (through mcp-remote; Claude Desktop passes its own environment, so %s must be set where it starts)\n%s\n\n", o.tokenEnv,
		jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
			"command": "npx", "args": []string{"-y", "mcp-remote", f.url, "--header", "Authorization:" + f.bearer},
		}}}))
}

func (f *clientForms) claudeCode() {
	o := f.o
	f.p("## Claude Code\n\n")
	f.stdioForm("### stdio\n%s\n\n", shellJoin(append([]string{"claude", "mcp", "add", o.name, "--", o.binary}, f.args...)))
	f.p("### HTTP (the shell expands %s when you run this)\nclaude mcp add --transport http %s %s --header \"Authorization: Bearer %s\"\n\n", f.env, shellQuote(o.name), shellQuote(f.url), f.env)
	f.p("### HTTP, project .mcp.json (Claude Code expands ${%s} at start)\n%s\n\n", o.tokenEnv,
		jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
			"type": "http", "url": f.url, "headers": map[string]string{"Authorization": f.bearer},
		}}}))
}

func (f *clientForms) cursor() {
	o := f.o
	f.p("## Cursor (~/.cursor/mcp.json or .cursor/mcp.json)\n\n")
	f.stdioForm("### stdio\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: f.stdio}}))
	f.p("### HTTP\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
		"url": f.url, "headers": map[string]string{"Authorization": "Bearer ${env:" + o.tokenEnv + "}"},
	}}}))
}

func (f *clientForms) inspector() {
	o := f.o
	f.p("## MCP Inspector (%s runs on Node 20; \"--\" keeps vmgate's flags from the Inspector)\n\n", inspectorPkg)
	f.stdioForm("### stdio\n%s\n\n", shellJoin(append([]string{"npx", "-y", inspectorPkg, "--cli", "--method", "tools/list", "--", o.binary}, f.args...)))
	f.p("### HTTP (CLI mode)\nnpx -y %s --cli %s --transport http --header \"Authorization: Bearer %s\" --method tools/list\n", inspectorPkg, shellQuote(f.url), f.env)
	f.p("# For the Inspector's web UI over HTTP (its page's origin, http://localhost:6274, is accepted on a loopback\n# listener; on another address add it to http.allowed_origins in vmgate.yaml), choose Streamable HTTP,\n# URL %s, and an Authorization header \"Bearer <token>\".\n", f.url)
}
