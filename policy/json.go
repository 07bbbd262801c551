package policy

import (
	"errors"

	"github.com/vmgate/vmgate/internal/strictjson"
)

// The policy document as a tree. encoding/json silently accepts duplicate
// keys and matches field names case-insensitively, and it does not say where
// a value was; a policy error must name its line and column. So the document
// is read by the strict lexer (internal/strictjson, shared with the server)
// into a tree of nodes that remember their byte offsets, and the policy is
// then built from the tree.

// Limits of the reader.
const (
	// MaxDocumentSize is the largest policy document Parse accepts.
	MaxDocumentSize = 1 << 20
	// MaxDepth is the deepest nesting of objects and arrays Parse accepts.
	MaxDepth = 32
)

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// node is one JSON value with the byte offset where it starts.
type node struct {
	kind kind
	off  int
	end  int    // the offset just past the value
	str  string // a string's value, or a number's literal text
	b    bool
	// members of an object, in document order
	keys    []string
	keyOffs []int
	vals    []*node
	elems   []*node // elements of an array
}

// syntaxError is a JSON syntax error at a byte offset.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return e.msg }

// parseJSON reads one JSON value that fills data (whitespace aside)
// through the strict lexer the server shares (internal/strictjson).
func parseJSON(data []byte) (*node, error) {
	l := strictjson.Lexer{MaxDepth: MaxDepth}
	l.Reset(data)
	t, err := l.Next()
	var n *node
	if err == nil {
		n, err = buildNode(&l, t)
	}
	if err == nil {
		_, err = l.Next() // End, or the error of what follows the document
	}
	if err != nil {
		var se *strictjson.SyntaxError
		if errors.As(err, &se) {
			return nil, &syntaxError{off: se.Off, msg: se.Msg}
		}
		return nil, &syntaxError{msg: err.Error()}
	}
	return n, nil
}

// buildNode returns the node of the value that starts with token t,
// reading the rest of it from l (which keeps to the JSON grammar: a key,
// then a value, in an object).
func buildNode(l *strictjson.Lexer, t strictjson.Token) (*node, error) {
	n, err := buildValue(l, t)
	if err != nil {
		return nil, err
	}
	n.end = l.Offset()
	return n, nil
}

func buildValue(l *strictjson.Lexer, t strictjson.Token) (*node, error) {
	switch t.Kind {
	case strictjson.BeginObject:
		n := &node{kind: kindObject, off: t.Off}
		for {
			k, err := l.Next()
			if err != nil {
				return nil, err
			}
			if k.Kind == strictjson.EndObject {
				return n, nil
			}
			v, err := nextNode(l)
			if err != nil {
				return nil, err
			}
			n.keys = append(n.keys, k.Text)
			n.keyOffs = append(n.keyOffs, k.Off)
			n.vals = append(n.vals, v)
		}
	case strictjson.BeginArray:
		n := &node{kind: kindArray, off: t.Off}
		for {
			e, err := l.Next()
			if err != nil {
				return nil, err
			}
			if e.Kind == strictjson.EndArray {
				return n, nil
			}
			v, err := buildNode(l, e)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
	case strictjson.String:
		return &node{kind: kindString, off: t.Off, str: t.Text}, nil
	case strictjson.Number:
		return &node{kind: kindNumber, off: t.Off, str: t.Text}, nil
	case strictjson.True, strictjson.False:
		return &node{kind: kindBool, off: t.Off, b: t.Kind == strictjson.True}, nil
	case strictjson.Null:
		return &node{kind: kindNull, off: t.Off}, nil
	}
	return nil, &syntaxError{off: t.Off, msg: "unexpected " + t.Kind.String()}
}

// nextNode reads the next value of l.
func nextNode(l *strictjson.Lexer) (*node, error) {
	t, err := l.Next()
	if err != nil {
		return nil, err
	}
	return buildNode(l, t)
}

// lineCol turns a byte offset into a 1-based line and column (in runes).
func lineCol(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	line, col = 1, 1
	for _, c := range string(data[:off]) {
		if c == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return line, col
}
