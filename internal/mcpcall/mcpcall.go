// Package mcpcall is the MCP client of `vmgate call`: one tools/call
// against a streamable HTTP endpoint or a stdio server it starts as a child,
// with the result as a script reads it. It is the client side of the
// protocol only; it imports neither the gate nor a transport.
package mcpcall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/server/jsonrpc"
)

// Options say which MCP server Call talks to: the streamable HTTP
// endpoint URL, or else a server command run as a child over stdio.
type Options struct {
	// URL is a streamable HTTP endpoint (http://127.0.0.1:8707/mcp).
	URL string
	// Token is the bearer token for URL.
	Token string
	// Command and Args start a stdio server (vmgate serve …) when URL is
	// empty. The child gets SIGKILL if this process dies; Call waits for it.
	Command string
	Args    []string
	// Stderr receives the child's stderr (default: discarded).
	Stderr io.Writer
	// Timeout bounds the whole call, start-up included (default 5 minutes).
	Timeout time.Duration
	// ClientVersion is the version the client names in initialize
	// (default "dev").
	ClientVersion string
}

// Result is a tools/call result as `vmgate call` prints it.
type Result struct {
	StructuredContent any    `json:"structuredContent,omitempty"`
	IsError           bool   `json:"isError"`
	Text              string `json:"text"`
}

// ErrArgs: the arguments given to Call are not one JSON object.
var ErrArgs = errors.New("arguments must be one JSON object")

// Call runs one tools/call of tool with args (a JSON object) against the
// server o names, and returns its result. A tool error (isError) is a
// result, not an error; an error means the call could not be made.
func Call(ctx context.Context, o Options, tool string, args []byte) (Result, error) {
	if tool == "" || len(tool) > 128 || strings.ContainsFunc(tool, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return Result{}, fmt.Errorf("call: invalid tool name %q", truncate(tool, 40))
	}
	if len(args) == 0 {
		args = []byte("{}")
	}
	v, err := jsonrpc.Decode(args)
	if err != nil {
		return Result{}, fmt.Errorf("call: %w: %w", ErrArgs, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return Result{}, fmt.Errorf("call: %w", ErrArgs)
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	c, err := o.client()
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		return Result{}, fmt.Errorf("call: start: %w", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	version := o.ClientVersion
	if version == "" {
		version = "dev"
	}
	init.Params.ClientInfo = mcp.Implementation{Name: "vmgate-call", Version: version}
	if _, err := c.Initialize(ctx, init); err != nil {
		return Result{}, fmt.Errorf("call: initialize: %w", err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = json.RawMessage(args)
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return Result{}, fmt.Errorf("call: %s: %w", tool, err)
	}
	out := Result{StructuredContent: res.StructuredContent, IsError: res.IsError}
	var texts []string
	for _, ct := range res.Content {
		if tc, ok := ct.(mcp.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	out.Text = strings.Join(texts, "\n")
	return out, nil
}

// client is the MCP client of the server o names: streamable HTTP to URL,
// or stdio to a child running Command.
func (o Options) client() (*mcpclient.Client, error) {
	switch {
	case o.URL != "":
		u, err := url.Parse(o.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("call: --url %q: want http(s)://host:port/mcp", o.URL)
		}
		var opts []transport.StreamableHTTPCOption
		if o.Token != "" {
			opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + o.Token}))
		}
		c, err := mcpclient.NewStreamableHttpClient(o.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("call: %w", err)
		}
		return c, nil
	case o.Command != "":
		stderr := o.Stderr
		if stderr == nil {
			stderr = io.Discard
		}
		t := transport.NewStdioWithOptions(o.Command, nil, o.Args,
			transport.WithCommandFunc(func(_ context.Context, command string, env, args []string) (*exec.Cmd, error) {
				// Not CommandContext: the transport's Close is the one owner
				// that ends and waits for the child.
				cmd := exec.Command(command, args...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				cmd.Stderr = stderr
				return cmd, nil
			}))
		return mcpclient.NewClient(t), nil
	}
	return nil, errors.New("call: no server: give a URL or a server command")
}

// truncate cuts s to n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
