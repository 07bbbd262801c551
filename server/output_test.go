package server

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/tools"
)

// outputSchemas caches the compiled outputSchema of each tool (they depend
// on nothing a fixture sets).
var outputSchemas sync.Map // tool name -> *jsonschema.Schema

// compiledOutput compiles spec's outputSchema (draft 2020-12, formats
// asserted), or fails t.
func compiledOutput(t testing.TB, spec *catalog.Tool) *jsonschema.Schema {
	t.Helper()
	if s, ok := outputSchemas.Load(spec.Name); ok {
		return s.(*jsonschema.Schema)
	}
	raw := spec.RawOutputSchema()
	if raw == nil {
		t.Fatalf("tool %s has no outputSchema: give its catalog.Tool the shapes of its structuredContent (catalog/output.go)", spec.Name)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("outputSchema of %s: %v", spec.Name, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	url := "vmgate:" + spec.Name + ".output.json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatalf("outputSchema of %s: %v", spec.Name, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		t.Fatalf("outputSchema of %s does not compile: %v", spec.Name, err)
	}
	outputSchemas.Store(spec.Name, s)
	return s
}

// checkOutput validates the structuredContent of a tools/call reply (out)
// to the request raw against the tool's outputSchema, as a client that
// validates (the official SDKs do) would. Every test that sends a call
// through the fixture runs it.
func (f *fixture) checkOutput(t testing.TB, raw string, out []byte) {
	t.Helper()
	var req struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal([]byte(raw), &req) != nil || req.Method != "tools/call" {
		return
	}
	spec := f.s.tools[req.Params.Name]
	if spec == nil {
		return
	}
	var reply struct {
		Result *struct {
			StructuredContent json.RawMessage `json:"structuredContent"`
			IsError           bool            `json:"isError"`
		} `json:"result"`
	}
	if json.Unmarshal(out, &reply) != nil || reply.Result == nil {
		return
	}
	if len(reply.Result.StructuredContent) == 0 {
		if !reply.Result.IsError {
			t.Errorf("%s: a success without structuredContent (its outputSchema makes clients refuse it)", spec.Name)
		}
		return
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(reply.Result.StructuredContent))
	if err != nil {
		t.Errorf("%s: structuredContent: %v", spec.Name, err)
		return
	}
	if err := compiledOutput(t, spec).Validate(inst); err != nil {
		t.Errorf("%s: structuredContent %s does not match its outputSchema: %v", spec.Name, catalog.Truncate(string(reply.Result.StructuredContent), 300), err)
	}
}

// TestCatalogueOutputSchemas: every tool of the catalogue has an
// outputSchema that compiles, offers the error shape, and is published in
// tools/list. A tool added without one fails here.
func TestCatalogueOutputSchemas(t *testing.T) {
	for _, spec := range tools.Catalogue(catalog.DefaultLimits()) {
		if len(spec.Output) == 0 {
			t.Errorf("tool %s has no output shapes; its outputSchema would be missing", spec.Name)
			continue
		}
		s := compiledOutput(t, spec)
		for _, msg := range []string{
			`{"error":"BACKEND ERROR","message":"the guest agent answered: No such file or directory"}`,
			`{"error":"RATE LIMITED","message":"retry in 3 s","retry_after_s":3}`,
		} {
			inst, _ := jsonschema.UnmarshalJSON(strings.NewReader(msg))
			if err := s.Validate(inst); err != nil {
				t.Errorf("outputSchema of %s refuses the error shape %s: %v", spec.Name, msg, err)
			}
		}
		for _, bad := range []string{`{}`, `{"error":"OOPS","message":"x"}`, `{"no_such_field":1}`} {
			inst, _ := jsonschema.UnmarshalJSON(strings.NewReader(bad))
			if s.Validate(inst) == nil {
				t.Errorf("outputSchema of %s accepts %s; want it refused", spec.Name, bad)
			}
		}
		if got := spec.MCPTool().RawOutputSchema; got == nil {
			t.Errorf("tools/list publishes %s without an outputSchema", spec.Name)
		}
	}
}
