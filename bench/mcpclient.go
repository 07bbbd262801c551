package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// errClientClosed is returned by calls on a client whose stream ended.
var errClientClosed = errors.New("mcp: connection closed")

// mcpClient is a minimal MCP client over newline-delimited JSON-RPC (the
// stdio transport). Calls may run concurrently: each request carries its
// own id and the reader goroutine hands every response to its caller.
//
// mu guards next, pending and err; wmu serialises writes to w.
type mcpClient struct {
	w   io.WriteCloser
	wmu sync.Mutex

	mu      sync.Mutex
	next    int64
	pending map[int64]chan rpcResponse
	err     error // set once the reader stopped

	done chan struct{}
}

type rpcResponse struct {
	ID     *int64          `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// toolResult is the part of a tools/call result the benchmarks check.
type toolResult struct {
	IsError           bool            `json:"isError"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	Content           []struct {
		Type string `json:"type"`
		Text string `json:"text"`
		Data string `json:"data"` // an image's base64
	} `json:"content"`
}

// newMCPClient starts reading r and completes the MCP handshake.
func newMCPClient(ctx context.Context, w io.WriteCloser, r io.Reader) (*mcpClient, error) {
	c := &mcpClient{w: w, pending: map[int64]chan rpcResponse{}, done: make(chan struct{})}
	go c.read(r)
	init := `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"vmgate-bench","version":"1"}}`
	if _, err := c.request(ctx, "initialize", json.RawMessage(init)); err != nil {
		c.Close()
		return nil, fmt.Errorf("mcp: initialize: %w", err)
	}
	if err := c.write([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		c.Close()
		return nil, fmt.Errorf("mcp: initialized: %w", err)
	}
	return c, nil
}

func (c *mcpClient) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var err error
	for sc.Scan() {
		var resp rpcResponse
		if jerr := json.Unmarshal(sc.Bytes(), &resp); jerr != nil {
			err = fmt.Errorf("mcp: undecodable message %.200q: %w", sc.Bytes(), jerr)
			break
		}
		if resp.ID == nil { // a notification
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[*resp.ID]
		delete(c.pending, *resp.ID)
		c.mu.Unlock()
		if !ok {
			err = fmt.Errorf("mcp: response to unknown id %d", *resp.ID)
			break
		}
		ch <- resp
	}
	if err == nil {
		err = sc.Err()
	}
	if err == nil {
		err = errClientClosed
	}
	c.mu.Lock()
	c.err = err
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *mcpClient) write(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.w.Write(append(msg, '\n'))
	return err
}

// request sends one JSON-RPC request and waits for its response.
func (c *mcpClient) request(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	ch := make(chan rpcResponse, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()
	msg := `{"jsonrpc":"2.0","id":` + strconv.FormatInt(id, 10) + `,"method":` + strconv.Quote(method) + `,"params":` + string(params) + `}`
	if err := c.write([]byte(msg)); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, fmt.Errorf("mcp: %s: %w", method, err)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return nil, fmt.Errorf("mcp: %s: %w", method, err)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("mcp: %s: error %d: %s", method, resp.Error.Code, resp.Error.Message)
		}
		return resp.Result, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, fmt.Errorf("mcp: %s: %w", method, ctx.Err())
	}
}

// callTool calls tool with args (a JSON object) and fails on an error
// result as well as on a protocol error.
func (c *mcpClient) callTool(ctx context.Context, tool string, args string) (toolResult, error) {
	params := `{"name":` + strconv.Quote(tool) + `,"arguments":` + args + `}`
	raw, err := c.request(ctx, "tools/call", json.RawMessage(params))
	if err != nil {
		return toolResult{}, err
	}
	var r toolResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return toolResult{}, fmt.Errorf("mcp: %s: result: %w", tool, err)
	}
	if r.IsError {
		text := ""
		if len(r.Content) > 0 {
			text = r.Content[0].Text
		}
		return r, fmt.Errorf("mcp: %s: error result: %s", tool, text)
	}
	return r, nil
}

// Close closes the write side; the server sees end of input.
func (c *mcpClient) Close() error { return c.w.Close() }
