package jsonrpc

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Envelope is a message that passed the checks every message gets.
type Envelope struct {
	M     map[string]any // the whole message, as Decode read it
	ID    any            // the request id (string or json.Number); HasID says whether there was one
	HasID bool
}

// InvalidError is a message whose envelope is wrong: it is answered with
// a JSON-RPC invalid request error carrying ID (nil when the id itself is
// what is wrong) and Msg.
type InvalidError struct {
	ID  any
	Msg string
}

func (e *InvalidError) Error() string { return "invalid request: " + e.Msg }

// envelopeKeys are the members a JSON-RPC message may have.
var envelopeKeys = map[string]bool{"jsonrpc": true, "id": true, "method": true, "params": true, "result": true, "error": true}

// Read decodes raw strictly and checks the envelope every message shares:
// at most maxBytes, one JSON object of the JSON-RPC members only, an id a
// reply can echo byte for byte, jsonrpc "2.0". An *InvalidError is answered
// as it says; any other error is a message that is malformed (too large,
// not strict JSON, an unknown member), which the gate audits when it may be
// a tools/call (Peek, MayBeToolsCall).
func Read(raw []byte, maxBytes int) (Envelope, error) {
	if len(raw) > maxBytes {
		return Envelope{}, fmt.Errorf("message of %d bytes exceeds the limit of %d", len(raw), maxBytes)
	}
	val, err := Decode(raw)
	if err != nil {
		return Envelope{}, err
	}
	m, isObject := val.(map[string]any)
	if !isObject {
		if _, batch := val.([]any); batch {
			return Envelope{}, &InvalidError{Msg: "batches are not supported"}
		}
		return Envelope{}, &InvalidError{Msg: "a message must be a JSON object"}
	}
	for k := range m {
		if !envelopeKeys[k] {
			return Envelope{}, fmt.Errorf("unknown member %q in the message", k)
		}
	}
	// The id first: a reply must carry it byte for byte, and mcp-go reads
	// numbers through float64, so only integers it holds exactly pass.
	id, hasID := m["id"]
	if hasID {
		switch n := id.(type) {
		case string:
		case json.Number:
			if !ExactIntegerID(n) {
				return Envelope{}, &InvalidError{Msg: "a number id must be an integer between -(2^53-1) and 2^53-1"}
			}
		default:
			return Envelope{}, &InvalidError{Msg: "id must be a string or a number"}
		}
	}
	if m["jsonrpc"] != "2.0" {
		return Envelope{}, &InvalidError{ID: id, Msg: "jsonrpc must be \"2.0\""}
	}
	return Envelope{M: m, ID: id, HasID: hasID}, nil
}

// maxExactInteger is 2^53-1, the largest integer a float64 holds exactly
// (and so every JSON reader, mcp-go's included).
const maxExactInteger = 1<<53 - 1

// ExactIntegerID reports whether n is an id every reader echoes byte for
// byte: an integer literal (no fraction, no exponent, no "-0") within
// ±(2^53-1).
func ExactIntegerID(n json.Number) bool {
	s := string(n)
	if s == "-0" || strings.ContainsAny(s, ".eE") {
		return false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return err == nil && v >= -maxExactInteger && v <= maxExactInteger
}

// ValidRawID reports whether raw is an id a reply can echo: a JSON string
// or an integer within ±(2^53-1).
func ValidRawID(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	if raw[0] == '"' {
		var s string
		return json.Unmarshal(raw, &s) == nil
	}
	return ExactIntegerID(json.Number(raw))
}

// CancelledID is the request id a notifications/cancelled (m) names, as
// encoding/json reads it; false when it names none.
func CancelledID(m map[string]any) (any, bool) {
	params, _ := m["params"].(map[string]any)
	raw, ok := params["requestId"]
	if !ok {
		return nil, false
	}
	return EncodingJSONValue(raw)
}
