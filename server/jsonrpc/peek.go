package jsonrpc

import "encoding/json"

// Peeked is what encoding/json (what mcp-go uses) reads of a message the
// strict reader refused: its id (nil unless it is one a reply can carry as
// it came), its method and, for a tools/call, the tool's name.
type Peeked struct {
	ID     any // a json.RawMessage, or nil
	Method string
	Tool   string
}

// Peek reads raw as encoding/json does. A message encoding/json cannot read
// either has no method.
func Peek(raw []byte) Peeked {
	var peek struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if err := json.Unmarshal(raw, &peek); err != nil {
		// Not even encoding/json can read it: its method does not count
		// (MayBeToolsCall decides whether it is audited).
		peek.Method = ""
	}
	p := Peeked{Method: peek.Method, Tool: peek.Params.Name}
	if len(peek.ID) > 0 && (peek.ID[0] == '"' || peek.ID[0] == '-' || peek.ID[0] >= '0' && peek.ID[0] <= '9') {
		p.ID = json.RawMessage(peek.ID)
	}
	return p
}

// MayBeToolsCall is a conservative test for a message that may be a
// tools/call in some reader's eyes (escaped or oddly cased method names
// included): such a message is audited when it is refused.
func MayBeToolsCall(raw []byte) bool {
	const n = len("tools/call")
	for i := 0; i+n <= len(raw) && i < 1<<16; i++ {
		if (raw[i] == 't' || raw[i] == 'T') && equalFoldASCII(raw[i:i+n], "tools/call") {
			return true
		}
	}
	return false
}

func equalFoldASCII(b []byte, s string) bool {
	for i := range len(s) {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
