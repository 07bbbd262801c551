package jsonrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/vmgate/vmgate/internal/strictjson"
)

// The strict JSON reader of MCP messages. encoding/json (and so mcp-go)
// silently keeps the last of two duplicate keys and matches field names
// case-insensitively; a policy that looked at one "vm" while the driver got
// another would be bypassed. So every message is read here first, through
// the lexer the policy parser shares (internal/strictjson): duplicate keys
// and keys that differ only in case are errors, strings must be valid
// UTF-8, nesting is bounded, and numbers stay json.Number so that a huge
// pid is not rounded into a valid one.

// MaxDepth bounds the nesting of a message.
const MaxDepth = 64

// ErrMalformed wraps every strict-decoding failure.
var ErrMalformed = errors.New("malformed JSON")

// lexers keeps the lexers of Decode: one reused keeps the room its
// stack of keys took, so a message costs only the values it holds.
var lexers = sync.Pool{New: func() any { return &strictjson.Lexer{MaxDepth: MaxDepth, Intern: intern} }}

// Decode decodes one JSON value filling data (whitespace aside) into
// map[string]any, []any, string, json.Number, bool or nil, through the
// strict lexer (internal/strictjson).
func Decode(data []byte) (any, error) {
	l := lexers.Get().(*strictjson.Lexer)
	defer func() {
		l.Reset(nil)
		lexers.Put(l)
	}()
	l.Reset(data)
	t, err := l.Next()
	var v any
	if err == nil {
		v, err = build(l, t)
	}
	if err == nil {
		_, err = l.Next() // End, or the error of what follows the value
	}
	if err != nil {
		var se *strictjson.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%w at byte %d: %s", ErrMalformed, se.Off, se.Msg)
		}
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return v, nil
}

// build returns the value that starts with token t, reading the rest of
// it from l (which keeps to the JSON grammar: a key, then a value, in an
// object).
func build(l *strictjson.Lexer, t strictjson.Token) (any, error) {
	switch t.Kind {
	case strictjson.BeginObject:
		m := make(map[string]any, 8)
		for {
			k, err := l.Next()
			if err != nil {
				return nil, err
			}
			if k.Kind == strictjson.EndObject {
				return m, nil
			}
			if m[k.Text], err = next(l); err != nil {
				return nil, err
			}
		}
	case strictjson.BeginArray:
		a := make([]any, 0, 4)
		for {
			e, err := l.Next()
			if err != nil {
				return nil, err
			}
			if e.Kind == strictjson.EndArray {
				return a, nil
			}
			v, err := build(l, e)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
	case strictjson.String:
		return t.Text, nil
	case strictjson.Number:
		return json.Number(t.Text), nil
	case strictjson.True:
		return true, nil
	case strictjson.False:
		return false, nil
	case strictjson.Null:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected %s at byte %d", t.Kind, t.Off)
}

// next reads the next value of l.
func next(l *strictjson.Lexer) (any, error) {
	t, err := l.Next()
	if err != nil {
		return nil, err
	}
	return build(l, t)
}

// intern returns the constant for the keys and values every tools/call
// carries, so decoding them allocates nothing; "" for anything else. The
// switch on string(b) does not allocate.
func intern(b []byte) string {
	switch string(b) {
	case "jsonrpc":
		return "jsonrpc"
	case "2.0":
		return "2.0"
	case "id":
		return "id"
	case "method":
		return "method"
	case "tools/call":
		return "tools/call"
	case "params":
		return "params"
	case "name":
		return "name"
	case "arguments":
		return "arguments"
	case "_meta":
		return "_meta"
	case "vm":
		return "vm"
	case "session":
		return "session"
	case "command":
		return "command"
	case "timeout_s":
		return "timeout_s"
	case "pid":
		return "pid"
	case "signal":
		return "signal"
	case "path":
		return "path"
	case "list_vms":
		return "list_vms"
	case "vm_status":
		return "vm_status"
	case "vm_agent_exec":
		return "vm_agent_exec"
	case "list_processes":
		return "list_processes"
	case "kill_process":
		return "kill_process"
	}
	return ""
}
