package catalog

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/mark3labs/mcp-go/mcp"
)

// schema returns the JSON Schema of fields as an object.
func schemaOf(fields []Field) map[string]any {
	props := make(map[string]any, len(fields))
	var required []string
	for _, f := range fields {
		props[f.Name] = f.schema()
		if f.Required {
			required = append(required, f.Name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func (f Field) schema() map[string]any {
	var s map[string]any
	switch f.Kind {
	case KindString:
		s = map[string]any{"type": "string"}
		if f.Enum != nil {
			s["enum"] = f.Enum
		}
		if f.MaxLen > 0 {
			s["maxLength"] = f.MaxLen
		}
	case KindInteger:
		s = map[string]any{"type": "integer", "minimum": f.Min}
		if f.Max != math.MaxInt64 {
			s["maximum"] = f.Max
		}
	case KindBoolean:
		s = map[string]any{"type": "boolean"}
	case KindStringArray:
		s = map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
		if !f.AllowEmpty {
			s["minItems"] = 1
		}
		if f.MaxLen > 0 {
			s["maxItems"] = f.MaxLen
		}
	case KindStringMap:
		s = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
		if f.MaxLen > 0 {
			s["maxProperties"] = f.MaxLen
		}
	case KindObject:
		s = schemaOf(f.Fields)
	}
	if f.Default != nil {
		s["default"] = f.Default
	}
	s["description"] = f.Desc
	return s
}

// MCPTool builds the mcp.Tool tools/list publishes.
func (t *Tool) MCPTool() mcp.Tool {
	raw, err := json.Marshal(schemaOf(t.Fields))
	if err != nil {
		panic(fmt.Sprintf("server: schema of %s: %v", t.Name, err)) // a programming error in the catalogue
	}
	tool := mcp.NewToolWithRawSchema(t.Name, t.Desc, raw)
	tool.Title = t.Title
	tool.Annotations = mcp.ToolAnnotation{
		Title:           t.Title,
		ReadOnlyHint:    mcp.ToBoolPtr(t.ReadOnly),
		DestructiveHint: mcp.ToBoolPtr(t.Destructive),
		IdempotentHint:  mcp.ToBoolPtr(t.Idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(t.OpenWorld),
	}
	tool.RawOutputSchema = t.RawOutputSchema()
	return tool
}
