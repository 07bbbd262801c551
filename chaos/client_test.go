package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// protocolVersion is the MCP revision the hand-written clients speak.
const protocolVersion = "2025-06-18"

// reply is what a client got back for one message.
type reply struct {
	Status  int             // HTTP status (0 over stdio)
	Body    []byte          // the raw response (HTTP body, or the stdio line)
	ID      json.RawMessage // the JSON-RPC id of the reply
	Result  *toolResult     // a JSON-RPC result that is a tool result
	RPCCode int             // a JSON-RPC error code (0: none)
	RPCMsg  string
	Raw     json.RawMessage // the JSON-RPC result, whatever it is
}

// toolResult is the part of a CallToolResult the campaign looks at.
type toolResult struct {
	IsError bool `json:"isError"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Structured json.RawMessage `json:"structuredContent"`
}

func (r *toolResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

var tagRE = regexp.MustCompile(`^\[[A-Z ]+\]`)

// tag is the tag a tool error starts with, "" for a success.
func (r *toolResult) tag() string {
	if !r.IsError {
		return ""
	}
	if m := tagRE.FindString(r.text()); m != "" {
		return m
	}
	return "[UNTAGGED]"
}

// outcome classifies a reply in one word for tables and expectations:
// "ok", a tool error's tag, "rpc:<code>", "http:<status>" or "silent".
func (r reply) outcome() string {
	switch {
	case r.Status != 0 && r.Status != http.StatusOK && r.Status != http.StatusAccepted:
		return "http:" + strconv.Itoa(r.Status)
	case r.RPCCode != 0:
		return "rpc:" + strconv.Itoa(r.RPCCode)
	case r.Result != nil && r.Result.IsError:
		return r.Result.tag()
	case r.Result != nil || r.Raw != nil:
		return "ok"
	}
	return "silent"
}

// parseRPC fills r from one JSON-RPC response message.
func (r *reply) parseRPC(msg []byte) error {
	var env struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg, &env); err != nil {
		return fmt.Errorf("chaos: bad JSON-RPC response %.200q: %w", msg, err)
	}
	r.ID = env.ID
	if env.Error != nil {
		r.RPCCode, r.RPCMsg = env.Error.Code, env.Error.Message
		return nil
	}
	r.Raw = env.Result
	var tr toolResult
	if json.Unmarshal(env.Result, &tr) == nil && (tr.Content != nil || tr.IsError) {
		r.Result = &tr
	}
	return nil
}

// httpClient is a minimal streamable-HTTP MCP client: one session,
// JSON or SSE replies.
type httpClient struct {
	url     string
	token   string
	hc      *http.Client
	session string
	nextID  atomic.Int64
}

func newHTTPClient(url, token string) *httpClient {
	return &httpClient{url: url, token: token, hc: &http.Client{Timeout: 2 * time.Minute}}
}

// post sends body as it is, with the client's token and session unless hdr
// overrides them (a nil value in hdr removes a header; "Host" forges the
// Host header).
func (c *httpClient) post(ctx context.Context, body []byte, hdr map[string][]string) (reply, error) {
	return c.postURL(ctx, c.url, body, hdr)
}

func (c *httpClient) postURL(ctx context.Context, url string, body []byte, hdr map[string][]string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
		req.Header.Set("Mcp-Protocol-Version", protocolVersion)
	}
	for k, vs := range hdr {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	// net/http sends req.Host, never a Host entry of the header map.
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
		req.Header.Del("Host")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return reply{}, fmt.Errorf("chaos: read reply: %w", err)
	}
	r := reply{Status: resp.StatusCode, Body: b}
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" && c.session == "" {
		c.session = s
	}
	if resp.StatusCode != http.StatusOK || len(bytes.TrimSpace(b)) == 0 {
		return r, nil
	}
	msg := b
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		msg = nil
		for _, line := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(line, "data:"); ok && strings.Contains(d, `"id"`) {
				msg = []byte(strings.TrimSpace(d))
			}
		}
		if msg == nil {
			return r, fmt.Errorf("chaos: SSE reply without a response: %.300q", b)
		}
	}
	return r, r.parseRPC(msg)
}

// initialize opens the MCP session.
func (c *httpClient) initialize(ctx context.Context) error {
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"chaos","version":"1"}}}`, c.nextID.Add(1), protocolVersion)
	r, err := c.post(ctx, []byte(init), nil)
	if err != nil {
		return fmt.Errorf("chaos: initialize: %w", err)
	}
	if r.Status != http.StatusOK || r.Raw == nil {
		return fmt.Errorf("chaos: initialize: status %d, %.300q", r.Status, r.Body)
	}
	r, err = c.post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), nil)
	if err != nil {
		return fmt.Errorf("chaos: notifications/initialized: %w", err)
	}
	if r.Status != http.StatusAccepted && r.Status != http.StatusOK {
		return fmt.Errorf("chaos: notifications/initialized: status %d, %.300q", r.Status, r.Body)
	}
	return nil
}

// call runs one tools/call.
func (c *httpClient) call(ctx context.Context, tool string, args any) (reply, error) {
	body, err := callBody(c.nextID.Add(1), tool, args)
	if err != nil {
		return reply{}, err
	}
	return c.post(ctx, body, nil)
}

func callBody(id int64, tool string, args any) ([]byte, error) {
	return json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args},
	})
}

// stdioClient drives `vmgate serve` over stdio: the test owns the process.
type stdioClient struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte // every line the server wrote
	stderr *syncBuffer
	done   chan struct{} // closed when the process was waited for
	err    error         // Wait's result, set before done closes
	nextID atomic.Int64
	wmu    sync.Mutex // wmu serialises writes to stdin
}

// openStdio starts `vmgate serve --config cfg --grant grant` on pipes and
// initializes it; the test ends it (within 5 s) if it has not closed it.
func openStdio(t *testing.T, cfg, grant string) *stdioClient {
	t.Helper()
	sc, err := startStdio(vmgateBin, cfg, grant)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.close(5 * time.Second) })
	if err := sc.initialize(); err != nil {
		t.Fatal(err)
	}
	return sc
}

// startStdio starts `vmgate serve --config cfg --grant grant` on pipes.
func startStdio(bin, cfg, grant string) (*stdioClient, error) {
	cmd := exec.Command(bin, "serve", "--config", cfg, "--grant", grant)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &stdioClient{cmd: cmd, stdin: stdin, lines: make(chan []byte, 1024), stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start vmgate serve (stdio): %w", err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(c.lines)
	}()
	go func() {
		<-read
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// send writes one line (a newline is added).
func (c *stdioClient) send(line []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.stdin.Write(append(append([]byte(nil), line...), '\n'))
	return err
}

// next returns the next line the server wrote, or an error after d.
func (c *stdioClient) next(d time.Duration) ([]byte, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return nil, errors.New("chaos: stdio: the server closed its output")
		}
		return l, nil
	case <-time.After(d):
		return nil, fmt.Errorf("chaos: stdio: no reply within %v", d)
	}
}

// initialize opens the MCP session over stdio.
func (c *stdioClient) initialize() error {
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"chaos","version":"1"}}}`, protocolVersion)
	if err := c.send([]byte(init)); err != nil {
		return err
	}
	l, err := c.next(60 * time.Second)
	if err != nil {
		return fmt.Errorf("chaos: stdio initialize: %w (stderr: %s)", err, c.stderr.String())
	}
	var r reply
	if err := r.parseRPC(l); err != nil || r.Raw == nil {
		return fmt.Errorf("chaos: stdio initialize: %q, %v", l, err)
	}
	return c.send([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
}

// close ends stdin and waits for the server to exit.
func (c *stdioClient) close(d time.Duration) error {
	c.stdin.Close()
	select {
	case <-c.done:
		return c.err
	case <-time.After(d):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("chaos: stdio server did not exit within %v of EOF", d)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
