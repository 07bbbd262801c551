// Package mcptest holds what tests that talk MCP to the gate share: a
// JSON-RPC reply as a test reads it, a tools/call message, tag checks and
// token hashes. It imports no package of the server, so the gate's own
// tests use it as the transports' tests do.
package mcptest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// InitMsg is an initialize request of protocol 2025-06-18.
const InitMsg = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`

// AllowAll is a policy that allows every call.
const AllowAll = `{"version":"1","default":"allow"}`

// Reply is a JSON-RPC response as a test reads it.
type Reply struct {
	ID     json.RawMessage `json:"id"`
	Result *struct {
		Content []struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			Data     string `json:"data"`     // an image's base64
			MimeType string `json:"mimeType"` // an image's type
		} `json:"content"`
		StructuredContent map[string]any `json:"structuredContent"`
		IsError           bool           `json:"isError"`
		Tools             []struct {
			Name         string         `json:"name"`
			InputSchema  map[string]any `json:"inputSchema"`
			OutputSchema map[string]any `json:"outputSchema"`
			Annotations  map[string]any `json:"annotations"`
		} `json:"tools"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Text is the text of r's first content, or "".
func (r Reply) Text() string {
	if r.Result == nil || len(r.Result.Content) == 0 {
		return ""
	}
	return r.Result.Content[0].Text
}

// HasTag reports whether r is a tool error whose text starts with tag.
func HasTag(r Reply, tag string) bool {
	return r.Result != nil && r.Result.IsError && strings.HasPrefix(r.Text(), tag+" ")
}

// ToolCall builds a tools/call message with arguments as raw JSON.
func ToolCall(id int, tool, args string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, args)
}

// SHA256Hex is the lowercase hex SHA-256 of s (a grant's token_sha256).
func SHA256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// InitStatus posts initialize to url with hdr ("Host" sets the Host) and
// returns the status.
func InitStatus(t testing.TB, url string, hdr map[string][]string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(InitMsg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, vs := range hdr {
		if k == "Host" {
			req.Host = vs[0]
			continue
		}
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Request is an MCP request over streamable HTTP: body (JSON) with token,
// in session (if not "", of protocol 2025-06-18).
func Request(ctx context.Context, method, url, token, session, body string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	return req
}

// Post sends one JSON-RPC message over streamable HTTP with token, in
// session (if not ""), and returns the reply and the session id.
func Post(t testing.TB, url, token, session, msg string) (Reply, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(Request(context.Background(), http.MethodPost, url, token, session, msg))
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %.80s: status %d: %s", msg, resp.StatusCode, body)
	}
	// An SSE reply carries the message in a data: line.
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(body), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				body = []byte(d)
			}
		}
	}
	var r Reply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("reply %.200q: %v", body, err)
	}
	return r, resp.Header.Get("Mcp-Session-Id")
}

// NextNote waits up to 10 s for the next notification on notes (one JSON
// message each) and sums it up: its method and, for a
// notifications/message, its level and event ("notifications/message
// notice approval_pending"). It returns the message as well.
func NextNote(t testing.TB, notes <-chan string) (summary, raw string) {
	t.Helper()
	select {
	case raw = <-notes:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
	}
	var n struct {
		Method string `json:"method"`
		Params struct {
			Level string         `json:"level"`
			Data  map[string]any `json:"data"`
		} `json:"params"`
	}
	if err := json.Unmarshal([]byte(raw), &n); err != nil {
		t.Fatalf("notification %s: %v", raw, err)
	}
	if n.Method != "notifications/message" {
		return n.Method, raw
	}
	ev, _ := n.Params.Data["event"].(string)
	return n.Method + " " + n.Params.Level + " " + ev, raw
}
