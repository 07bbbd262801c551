package server

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
// shapes (toolSpec.output, written beside the handler that fills it), or
// the error shape every refusal and failure has ({"error": <tag without
// brackets>, "message": …}, plus the tag's own fields). A tool without
// output shapes is a programming error: catalogue_test.go fails for it.

// errorTags are the "error" values of the error shape.
var errorTags = []string{
	strings.Trim(TagDenied, "[]"), strings.Trim(TagRateLimited, "[]"), strings.Trim(TagApproval, "[]"),
	strings.Trim(TagInvalid, "[]"), strings.Trim(TagUnknownVM, "[]"), strings.Trim(TagBackend, "[]"),
	strings.Trim(TagTimedOut, "[]"), strings.Trim(TagQuota, "[]"),
}

// errorShape is the structuredContent of a tool error. The fields beyond
// error and message depend on the tag (retry_after_s, approval_id,
// refused, pid, …), so more are allowed.
func errorShape() map[string]any {
	return map[string]any{
		"type":     "object",
		"required": []string{"error", "message"},
		"properties": map[string]any{
			"error":   map[string]any{"type": "string", "enum": errorTags},
			"message": map[string]any{"type": "string"},
		},
	}
}

// The building blocks of the result shapes.
var (
	oString  = map[string]any{"type": "string"}
	oInteger = map[string]any{"type": "integer"}
	oBoolean = map[string]any{"type": "boolean"}
	oNumber  = map[string]any{"type": "number"}
	oNonNeg  = map[string]any{"type": "integer", "minimum": 0}
	oTime    = map[string]any{"type": "string", "format": "date-time"}
)

// oObject is a closed object: exactly props, of which required must be there.
func oObject(props map[string]any, required ...string) map[string]any {
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// oOpen is an object whose listed props have their shapes and whose
// other fields are free: a report the guest or backend makes and may grow.
func oOpen(props map[string]any, required ...string) map[string]any {
	o := oObject(props, required...)
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

func oArray(items map[string]any) map[string]any {
	return map[string]any{"type": "array", "items": items}
}

// undoProps are what withUndo (undo.go) adds to the result of a tool a
// snapshot_before may be on (policy.SnapshotBeforeTools).
var undoProps = map[string]any{"undo_snapshot": oString, "undo_call": oString, "undo_taken": oTime, "undo_expires": oTime}

// outputSchema is t's published outputSchema: one of its result shapes or
// the error shape.
func (t *toolSpec) outputSchema() map[string]any {
	shapes := make([]any, 0, len(t.output)+1)
	for _, s := range t.output {
		if slices.Contains(policy.SnapshotBeforeTools, t.name) {
			s = withProps(s, undoProps)
		}
		shapes = append(shapes, s)
	}
	shapes = append(shapes, errorShape())
	return map[string]any{"type": "object", "anyOf": shapes}
}

// rawOutputSchema is t's outputSchema as JSON, nil for a tool without
// output shapes (TestCatalogueOutputSchemas fails for it).
func (t *toolSpec) rawOutputSchema() json.RawMessage {
	if len(t.output) == 0 {
		return nil
	}
	raw, err := json.Marshal(t.outputSchema())
	if err != nil {
		panic(fmt.Sprintf("server: output schema of %s: %v", t.name, err))
	}
	return raw
}
