package server

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
	"github.com/vmgate/vmgate/server/tools"
)

// FuzzDecodeArguments drives the strict reader and every tool's validator
// with arbitrary bytes. Properties: nothing panics; whatever decodeStrict
// accepts, encoding/json (what mcp-go uses) reads as the same value, so the
// gate and the handler can never see different arguments; a validated
// argument map holds only the tool's own fields and encodes back to JSON
// that the strict reader accepts.
func FuzzDecodeArguments(f *testing.F) {
	for _, seed := range []string{
		`{"vm":"lab/vm1"}`,
		`{"vm":"lab/vm1","command":["echo","hi"],"timeout_s":5,"env":{"A":"b"}}`,
		`{"vm":"lab/vm1","vm":"lab/vm2"}`,
		`{"vm":"lab/vm1","VM":"lab/vm2"}`,
		`{"vm":"lab/vm1","pid":99999999999999999999,"signal":"KILL"}`,
		`{"vm":"lab/vm1","pid":1e3}`,
		`{"vm":"lab/\ud800"}`,
		`{"a":[[[[[[[[[[]]]]]]]]]]}`,
		`{"vm":"lab/vm1","limits":{"memory_mb":64,"pids":10}}`,
		`{"vm":"lab/vm1","path":"/etc/hostname","max_bytes":0}`,
		"{\"vm\":\"lab/vm1\u0000\"}",
	} {
		f.Add([]byte(seed))
	}
	list := tools.Catalogue(catalog.DefaultLimits())
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := jsonrpc.Decode(data)
		if err != nil {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var std any
		if err := dec.Decode(&std); err != nil {
			t.Fatalf("decodeStrict accepted %q but encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(v, std) {
			t.Fatalf("jsonrpc.Decode(%q) = %#v; encoding/json reads %#v", data, v, std)
		}
		args, ok := v.(map[string]any)
		if !ok {
			return
		}
		for _, spec := range list {
			valid, err := spec.Validate(args)
			if err != nil {
				continue
			}
			for k := range valid {
				if spec.Field(k) == nil {
					t.Fatalf("%s.validate(%q) kept unknown argument %q", spec.Name, data, k)
				}
			}
			if _, err := spec.Decode(valid); err != nil {
				t.Fatalf("%s.validate(%q) = %#v, which does not decode: %v", spec.Name, data, valid, err)
			}
			b, err := json.Marshal(valid)
			if err != nil {
				t.Fatalf("%s.validate(%q) = %#v; does not encode: %v", spec.Name, data, valid, err)
			}
			if _, err := jsonrpc.Decode(b); err != nil {
				t.Fatalf("%s.validate(%q) encodes to %q, which the strict reader refuses: %v", spec.Name, data, b, err)
			}
		}
	})
}
