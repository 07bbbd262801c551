package stdio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// Elicitation over stdio: a server-to-client elicitation/create request
// (the client approvals of clients older than protocol 2026-07-28,
// server/elicit_legacy.go) is written to the client like any message, and
// the client's answer, read by Serve, is handed to the request waiting for
// it (clientRequests.deliver).

// clientRequests are the requests a stdio session sent its client and
// waits answers for.
type clientRequests struct {
	mu      sync.Mutex // guards next, pending and closed
	next    int64
	pending map[string]chan clientResponse // by the request id as JSON
	closed  bool                           // the client's input ended: no answer will come
}

// errInputClosed: the client's input ended before it answered.
var errInputClosed = errors.New("the client's input ended")

// close answers every pending request, and every later one, with
// errInputClosed.
func (c *clientRequests) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for id, ch := range c.pending {
		ch <- clientResponse{malformed: errInputClosed}
		delete(c.pending, id)
	}
}

// clientResponse is a client's answer to one request: result or error.
type clientResponse struct {
	result    json.RawMessage
	err       *jsonrpc.ErrorBody
	malformed error // the response itself did not parse strictly
}

// ErrClientError: the client answered a request with a JSON-RPC error.
var ErrClientError = errors.New("the client answered with an error")

// start registers a new request and returns its id and the channel its
// answer arrives on.
func (c *clientRequests) start() (string, chan clientResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	id := strconv.Quote("vmgate-" + strconv.FormatInt(c.next, 10))
	ch := make(chan clientResponse, 1)
	if c.closed {
		ch <- clientResponse{malformed: errInputClosed}
		return id, ch
	}
	if c.pending == nil {
		c.pending = map[string]chan clientResponse{}
	}
	c.pending[id] = ch
	return id, ch
}

func (c *clientRequests) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// deliver hands a response to the request it answers. It reports whether
// raw was the response to a pending request (then it is consumed, whatever
// its content).
func (c *clientRequests) deliver(raw []byte) bool {
	var peek struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	c.mu.Lock()
	waiting := len(c.pending) > 0
	c.mu.Unlock()
	if !waiting || json.Unmarshal(raw, &peek) != nil || peek.Method != nil || len(peek.ID) == 0 {
		return false
	}
	id := string(peek.ID)
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if !ok {
		return false
	}
	var r clientResponse
	switch _, err := jsonrpc.Decode(raw); {
	case err != nil:
		r.malformed = err
	case len(peek.Error) > 0 && string(peek.Error) != "null":
		var e jsonrpc.ErrorBody
		if json.Unmarshal(peek.Error, &e) != nil {
			r.malformed = errors.New("an error that is not a JSON-RPC error object")
		} else {
			r.err = &e
		}
	case len(peek.Result) == 0 || string(peek.Result) == "null":
		r.malformed = errors.New("neither result nor error")
	default:
		r.result = peek.Result
	}
	ch <- r // buffered, and only this goroutine got ch out of pending
	return true
}

// GetClientInfo, SetClientInfo, GetClientCapabilities and
// SetClientCapabilities keep what the client said at initialize.

func (s *session) GetClientInfo() mcp.Implementation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientInfo
}

func (s *session) SetClientInfo(ci mcp.Implementation) {
	s.mu.Lock()
	s.clientInfo = ci
	s.mu.Unlock()
}

func (s *session) GetClientCapabilities() mcp.ClientCapabilities {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientCaps
}

func (s *session) SetClientCapabilities(c mcp.ClientCapabilities) {
	s.mu.Lock()
	s.clientCaps = c
	s.mu.Unlock()
}

// RequestElicitation sends an elicitation/create request to the client and
// waits for its answer until ctx ends.
func (s *session) RequestElicitation(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	if s.send == nil {
		return nil, mcpserver.ErrElicitationNotSupported
	}
	id, ch := s.requests.start()
	defer s.requests.forget(id)
	msg, err := json.Marshal(struct {
		JSONRPC string                `json:"jsonrpc"`
		ID      json.RawMessage       `json:"id"`
		Method  string                `json:"method"`
		Params  mcp.ElicitationParams `json:"params"`
	}{"2.0", json.RawMessage(id), string(mcp.MethodElicitationCreate), req.Params})
	if err != nil {
		return nil, fmt.Errorf("stdio: encode: %w", err)
	}
	if err := s.send(msg); err != nil {
		return nil, fmt.Errorf("stdio: send: %w", err)
	}
	select {
	case r := <-ch:
		if errors.Is(r.malformed, errInputClosed) {
			return nil, fmt.Errorf("stdio: %w", r.malformed)
		}
		if r.malformed != nil {
			return nil, fmt.Errorf("stdio: malformed response: %w", r.malformed)
		}
		if r.err != nil {
			return nil, fmt.Errorf("stdio: %w: %d %s", ErrClientError, r.err.Code, catalog.Truncate(r.err.Message, 100))
		}
		v, err := jsonrpc.Decode(r.result)
		if err != nil {
			return nil, fmt.Errorf("stdio: malformed result: %w", err)
		}
		m, _ := v.(map[string]any)
		action, _ := m["action"].(string)
		if m == nil || action == "" {
			return nil, errors.New("stdio: malformed result: no action")
		}
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
			Action: mcp.ElicitationResponseAction(action), Content: m["content"],
		}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var (
	_ mcpserver.SessionWithClientInfo  = (*session)(nil)
	_ mcpserver.SessionWithElicitation = (*session)(nil)
)
