package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/internal/mcpcall"
)

func init() { commands = append(commands, newCallCmd) }

var envVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func newCallCmd() *cobra.Command {
	var (
		args     string
		url      string
		tokenEnv string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "call TOOL [--args JSON] [--url URL [--token-env VAR]] [-- serve args...]",
		Short: "Call one tool of an MCP server and print the result as JSON (for scripts)",
		Long: `call is a small MCP client for scripts. It calls TOOL with the arguments
--args (a JSON object) and prints {"structuredContent":…,"isError":…,"text":…}.
It exits 1 when the result is an error (isError), 2 when the call could not be
made.

With --url it talks streamable HTTP; the bearer token is read from the
environment variable named by --token-env (default VMGATE_TOKEN), never from
the command line. Otherwise it starts "vmgate serve" with the arguments after
"--" (serve's flags; a leading "serve" is allowed) as its child over stdio,
and stops it afterwards:

  vmgate call list_vms
  vmgate call vm_agent_exec --args '{"vm":"lab/vm1","command":["uname","-a"]}' -- --config vmgate.yaml
  VMGATE_TOKEN=… vmgate call list_vms --url http://127.0.0.1:8707/mcp`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, pos []string) error {
			tool := pos[0]
			var serveArgs []string
			if n := cmd.ArgsLenAtDash(); n >= 0 {
				if n != 1 {
					return fmt.Errorf("call: want exactly one TOOL before --, got %d arguments", n)
				}
				serveArgs = pos[n:]
			} else if len(pos) != 1 {
				return fmt.Errorf("call: unexpected arguments %q (serve arguments go after --)", pos[1:])
			}
			o := mcpcall.Options{Timeout: timeout, Stderr: os.Stderr, ClientVersion: version}
			if url != "" {
				if len(serveArgs) > 0 {
					return fmt.Errorf("call: --url and serve arguments after -- exclude each other")
				}
				if !envVarName.MatchString(tokenEnv) {
					return fmt.Errorf("call: --token-env %q is not an environment variable name", tokenEnv)
				}
				o.URL, o.Token = url, os.Getenv(tokenEnv)
			} else {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("call: cannot find the vmgate binary: %w", err)
				}
				o.Command, o.Args = exe, childArgs(serveArgs)
			}
			res, err := mcpcall.Call(cmd.Context(), o, tool, []byte(args))
			if err != nil {
				return &exitError{code: 2, msg: err.Error()}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				return fmt.Errorf("call: %w", err)
			}
			if res.IsError {
				return &exitError{code: 1, msg: "call: " + tool + ": the tool returned an error"}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&args, "args", "{}", "the tool's arguments as a JSON object")
	cmd.Flags().StringVar(&url, "url", "", "streamable HTTP endpoint (e.g. http://127.0.0.1:8707/mcp) instead of a stdio child")
	cmd.Flags().StringVar(&tokenEnv, "token-env", "VMGATE_TOKEN", "environment variable holding the bearer token for --url")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "bound on the whole call")
	return cmd
}

// childArgs is the stdio child's command line: serve and the arguments
// after "--". A leading "serve" there ("-- serve --grant local") names the
// subcommand call adds itself: it is taken as meant, not passed on as
// serve's unknown positional argument.
func childArgs(afterDash []string) []string {
	if len(afterDash) > 0 && afterDash[0] == "serve" {
		afterDash = afterDash[1:]
	}
	return append([]string{"serve"}, afterDash...)
}
