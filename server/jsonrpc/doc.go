// Package jsonrpc reads and writes the JSON-RPC 2.0 messages of MCP the
// way the gate needs them: every message is decoded strictly (Decode, on
// the lexer the policy parser shares, internal/strictjson), its envelope is
// checked before anything else looks at it (Read), and the replies the gate
// answers itself are encoded here (ErrorReply, ResultReply), byte for byte
// as mcp-go writes its own.
//
// It also knows how encoding/json, and so mcp-go, reads the same bytes
// (EncodingJSONValue, NumbersFit, Peek), so that the gate can tell which
// messages mcp-go would read differently from the strict reader.
//
// The package imports neither the gate (server) nor a transport; it is safe
// for concurrent use.
package jsonrpc
