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
	"strings"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newClientsCmd) }

type clientsOptions struct {
	config   string
	grant    string
	httpAddr string
	tokenEnv string
	name     string
	binary   string
	// noToken: no grant of the config has a token_sha256, so HTTP
	// refuses every request until one does.
	noToken bool
}

// fromConfig fills in what the config (or the embedded defaults) says:
// the HTTP address when --http is not given, whether any grant has a
// token, and the stdio grant: --grant when given (it must be a grant),
// else "local", else the config's first grant.
func (o *clientsOptions) fromConfig(grantSet bool) error {
	cfg, err := loadConfig(o.config)
	if err != nil {
		return fmt.Errorf("clients: %w", err)
	}
	if o.httpAddr == "" {
		o.httpAddr = cmp.Or(cfg.HTTP.Addr, "127.0.0.1:8707")
	}
	o.noToken = true
	for _, g := range cfg.Grants {
		if g.TokenSHA256 != "" {
			o.noToken = false
		}
	}
	if err := checkGrant(cfg, o.config, o.grant); err != nil {
		if grantSet || len(cfg.Grants) == 0 {
			return fmt.Errorf("clients: %w", err)
		}
		o.grant = cfg.Grants[0].Name
	}
	return nil
}

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
			if o.config != "" {
				abs, err := filepath.Abs(o.config)
				if err != nil {
					return fmt.Errorf("clients: --config: %w", err)
				}
				o.config = abs
			}
			if err := o.fromConfig(cmd.Flags().Changed("grant")); err != nil {
				return err
			}
			return writeClients(cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.config, "config", "", "config file the stdio forms pass to vmgate serve (default: embedded defaults)")
	cmd.Flags().StringVar(&o.grant, "grant", "local", "grant of the stdio forms")
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
	url := "http://" + net.JoinHostPort(host, port) + "/mcp"
	args := []string{"serve"}
	if o.config != "" {
		args = append(args, "--config", o.config)
	}
	args = append(args, "--grant", o.grant)
	stdio := map[string]any{"command": o.binary, "args": args}
	env := "$" + o.tokenEnv
	bearer := "Bearer ${" + o.tokenEnv + "}"

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# vmgate MCP client configurations\n")
	if o.noToken {
		p("# stdio: the client starts vmgate as grant %q. HTTP: no grant has a token_sha256 yet, so `vmgate serve --http %s`\n"+
			"# refuses every request (401); make a token, put its SHA-256 in a grant's token_sha256 (README: Install),\n# then export %s=<that token>.\n\n", o.grant, o.httpAddr, o.tokenEnv)
	} else {
		p("# stdio: the client starts vmgate as grant %q. HTTP: run `vmgate serve --http %s` and export %s=<the grant's token>.\n\n", o.grant, o.httpAddr, o.tokenEnv)
	}

	p("## Claude Desktop (claude_desktop_config.json)\n\n### stdio\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: stdio}}))
	p("### HTTP (through mcp-remote; Claude Desktop passes its own environment, so %s must be set where it starts)\n%s\n\n", o.tokenEnv,
		jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
			"command": "npx", "args": []string{"-y", "mcp-remote", url, "--header", "Authorization:" + bearer},
		}}}))

	p("## Claude Code\n\n### stdio\n%s\n\n", shellJoin(append([]string{"claude", "mcp", "add", o.name, "--", o.binary}, args...)))
	p("### HTTP (the shell expands %s when you run this)\nclaude mcp add --transport http %s %s --header \"Authorization: Bearer %s\"\n\n", env, shellQuote(o.name), shellQuote(url), env)
	p("### HTTP, project .mcp.json (Claude Code expands ${%s} at start)\n%s\n\n", o.tokenEnv,
		jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
			"type": "http", "url": url, "headers": map[string]string{"Authorization": bearer},
		}}}))

	p("## Cursor (~/.cursor/mcp.json or .cursor/mcp.json)\n\n### stdio\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: stdio}}))
	p("### HTTP\n%s\n\n", jsonBlock(map[string]any{"mcpServers": map[string]any{o.name: map[string]any{
		"url": url, "headers": map[string]string{"Authorization": "Bearer ${env:" + o.tokenEnv + "}"},
	}}}))

	p("## MCP Inspector (%s runs on Node 20; \"--\" keeps vmgate's flags from the Inspector)\n\n### stdio\n%s\n\n", inspectorPkg,
		shellJoin(append([]string{"npx", "-y", inspectorPkg, "--cli", "--method", "tools/list", "--", o.binary}, args...)))
	p("### HTTP (CLI mode)\nnpx -y %s --cli %s --transport http --header \"Authorization: Bearer %s\" --method tools/list\n", inspectorPkg, shellQuote(url), env)
	p("# For the Inspector's web UI over HTTP (its page's origin, http://localhost:6274, is accepted on a loopback\n# listener; on another address add it to http.allowed_origins in vmgate.yaml), choose Streamable HTTP,\n# URL %s, and an Authorization header \"Bearer <token>\".\n", url)
	_, err = io.WriteString(w, b.String())
	return err
}
