package jsonrpc

import (
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"
)

// ErrorBody is the error member of a JSON-RPC error reply.
type ErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// ErrorReply is a JSON-RPC error reply to id.
func ErrorReply(id any, code int, msg string) []byte {
	b, _ := json.Marshal(struct {
		JSONRPC string    `json:"jsonrpc"`
		ID      any       `json:"id"`
		Error   ErrorBody `json:"error"`
	}{"2.0", id, ErrorBody{code, msg}})
	return b
}

// errorWithData is the error member of ErrorDataReply.
type errorWithData struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// ErrorDataReply is a JSON-RPC error reply to id with data.
func ErrorDataReply(id any, code int, msg string, data any) []byte {
	b, _ := json.Marshal(struct {
		JSONRPC string        `json:"jsonrpc"`
		ID      any           `json:"id"`
		Error   errorWithData `json:"error"`
	}{"2.0", id, errorWithData{code, msg, data}})
	return b
}

// ResultReply is the JSON-RPC reply to id carrying the tool result r.
func ResultReply(id any, r *mcp.CallToolResult) []byte {
	b, err := json.Marshal(struct {
		JSONRPC string              `json:"jsonrpc"`
		ID      any                 `json:"id"`
		Result  *mcp.CallToolResult `json:"result"`
	}{"2.0", id, r})
	if err != nil {
		return ErrorReply(id, mcp.INTERNAL_ERROR, "cannot encode the result")
	}
	return b
}
