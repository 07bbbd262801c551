package catalog

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vmgate/vmgate/policy"
)

// Output schemas. Every tool publishes an outputSchema (tools/list) that
// its structuredContent always matches: one of the tool's own result
// shapes (Tool.Output, written beside the handler that fills it), or
// the error shape every refusal and failure has ({"error": <tag without
// brackets>, "message": …}, plus the tag's own fields). A tool without
// output shapes is a programming error: catalogue_test.go fails for it.

// errorTags are the "error" values of the error shape.
func errorTags() []string {
	return []string{
		strings.Trim(TagDenied, "[]"), strings.Trim(TagRateLimited, "[]"), strings.Trim(TagApproval, "[]"),
		strings.Trim(TagInvalid, "[]"), strings.Trim(TagUnknownVM, "[]"), strings.Trim(TagBackend, "[]"),
		strings.Trim(TagTimedOut, "[]"), strings.Trim(TagQuota, "[]"),
	}
}

// errorShape is the structuredContent of a tool error. The fields beyond
// error and message depend on the tag (retry_after_s, approval_id,
// refused, pid, …), so more are allowed.
func errorShape() map[string]any {
	return map[string]any{
		"type":     "object",
		"required": []string{"error", "message"},
		"properties": map[string]any{
			"error":   map[string]any{"type": "string", "enum": errorTags()},
			"message": map[string]any{"type": "string"},
		},
	}
}

// The building blocks of the result shapes: each returns a new schema.

// OString is a string.
func OString() map[string]any { return map[string]any{"type": "string"} }

// OInteger is an integer.
func OInteger() map[string]any { return map[string]any{"type": "integer"} }

// OBoolean is a boolean.
func OBoolean() map[string]any { return map[string]any{"type": "boolean"} }

// ONumber is a number.
func ONumber() map[string]any { return map[string]any{"type": "number"} }

// ONonNeg is an integer of at least 0.
func ONonNeg() map[string]any { return map[string]any{"type": "integer", "minimum": 0} }

// OTime is a time in RFC 3339.
func OTime() map[string]any { return map[string]any{"type": "string", "format": "date-time"} }

// OAny is a JSON object of any shape (a report the guest or backend makes).
func OAny() map[string]any { return map[string]any{"type": "object"} }

// OObject is a closed object: exactly props, of which required must be there.
func OObject(props map[string]any, required ...string) map[string]any {
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// OOpen is an object whose listed props have their shapes and whose
// other fields are free: a report the guest or backend makes and may grow.
func OOpen(props map[string]any, required ...string) map[string]any {
	o := OObject(props, required...)
	delete(o, "additionalProperties")
	return o
}

// withProps is shape (an object) with props added to its properties.
func withProps(shape, props map[string]any) map[string]any {
	out := maps.Clone(shape)
	p := maps.Clone(out["properties"].(map[string]any))
	maps.Copy(p, props)
	out["properties"] = p
	return out
}

// OArray is an array of items.
func OArray(items map[string]any) map[string]any {
	return map[string]any{"type": "array", "items": items}
}

// undoProps are what the gate adds to the result of a tool a
// snapshot_before may be on (policy.SnapshotBeforeTools; server/undo.go).
func undoProps() map[string]any {
	return map[string]any{"undo_snapshot": OString(), "undo_call": OString(), "undo_taken": OTime(), "undo_expires": OTime()}
}

// OutputSchema is t's published outputSchema: one of its result shapes or
// the error shape.
func (t *Tool) OutputSchema() map[string]any {
	shapes := make([]any, 0, len(t.Output)+1)
	for _, s := range t.Output {
		if slices.Contains(policy.SnapshotBeforeTools(), t.Name) {
			s = withProps(s, undoProps())
		}
		shapes = append(shapes, s)
	}
	shapes = append(shapes, errorShape())
	return map[string]any{"type": "object", "anyOf": shapes}
}

// RawOutputSchema is t's outputSchema as JSON, nil for a tool without
// output shapes (TestCatalogueOutputSchemas fails for it).
func (t *Tool) RawOutputSchema() json.RawMessage {
	if len(t.Output) == 0 {
		return nil
	}
	raw, err := json.Marshal(t.OutputSchema())
	if err != nil {
		panic(fmt.Sprintf("server: output schema of %s: %v", t.Name, err))
	}
	return raw
}
