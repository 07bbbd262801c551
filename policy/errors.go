package policy

import (
	"fmt"
	"strings"
)

// MaxErrors is how many errors Parse collects before it stops.
const MaxErrors = 50

// Error is one problem in a policy document.
type Error struct {
	File string
	Line int // 1-based
	Col  int // 1-based, in characters
	// Path is the JSON path of the value, like "tools.kill_process.limits[0].window";
	// empty for the document as a whole.
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s: %s", e.File, e.Line, e.Col, e.Path, e.Msg)
}

// Errors is every problem Parse found, in document order (at most MaxErrors
// and a last one saying there were more).
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}
