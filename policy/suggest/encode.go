package suggest

import (
	"bytes"
	"encoding/json"
	"slices"
)

// encode writes the document for people to read: one member a line, and
// each condition and limit whole on its own line, so that a condition
// reads as the engine quotes it in a denial (`args.signal in ["TERM"]`).
func (d *document) encode() ([]byte, error) {
	var b bytes.Buffer
	w := &docWriter{b: &b}
	b.WriteString("{\n")
	w.member(1, "version", d.Version, false)
	w.member(1, "_why", d.Why, false)
	w.member(1, "default", d.Default, false)
	if d.AllTools != nil {
		b.WriteString(`  "all_tools": {` + "\n")
		list(w, 2, "limits", d.AllTools.Limits, true)
		b.WriteString("  },\n")
	}
	b.WriteString(`  "tools": {` + "\n")
	names := make([]string, 0, len(d.Tools))
	for n := range d.Tools {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, n := range names {
		w.tool(n, d.Tools[n], i == len(names)-1)
	}
	b.WriteString("  }\n}\n")
	return b.Bytes(), w.err
}

type docWriter struct {
	b   *bytes.Buffer
	err error
}

// value is v as compact JSON, "<" and ">" as themselves.
func (w *docWriter) value(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil && w.err == nil {
		w.err = err
	}
	return string(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

func (w *docWriter) indent(depth int) {
	for range depth {
		w.b.WriteString("  ")
	}
}

func (w *docWriter) member(depth int, name string, v any, last bool) {
	w.indent(depth)
	w.b.WriteString(w.value(name) + ": " + w.value(v))
	if !last {
		w.b.WriteByte(',')
	}
	w.b.WriteByte('\n')
}

// list writes a member whose value is a list, one element a line.
func list[T any](w *docWriter, depth int, name string, elems []T, last bool) {
	w.indent(depth)
	w.b.WriteString(w.value(name) + ": [\n")
	for i, e := range elems {
		w.indent(depth + 1)
		w.b.WriteString(w.value(e))
		if i < len(elems)-1 {
			w.b.WriteByte(',')
		}
		w.b.WriteByte('\n')
	}
	w.indent(depth)
	w.b.WriteString("]")
	if !last {
		w.b.WriteByte(',')
	}
	w.b.WriteByte('\n')
}

func (w *docWriter) tool(name string, r *toolRule, last bool) {
	w.indent(2)
	w.b.WriteString(w.value(name) + ": {\n")
	// The members present, in order, each written knowing whether it is
	// the last.
	parts := []func(last bool){func(l bool) { w.member(3, "_why", r.Why, l) }}
	if r.Action != "" {
		parts = append(parts, func(l bool) { w.member(3, "action", r.Action, l) })
	}
	if len(r.Require) > 0 {
		parts = append(parts, func(l bool) { list(w, 3, "require", r.Require, l) })
	}
	if len(r.DenyIf) > 0 {
		parts = append(parts, func(l bool) { list(w, 3, "deny_if", r.DenyIf, l) })
	}
	if len(r.Limits) > 0 {
		parts = append(parts, func(l bool) { list(w, 3, "limits", r.Limits, l) })
	}
	for i, write := range parts {
		write(i == len(parts)-1)
	}
	w.indent(2)
	w.b.WriteString("}")
	if !last {
		w.b.WriteByte(',')
	}
	w.b.WriteByte('\n')
}
