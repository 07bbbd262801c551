package server

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/jsonrpc"
)

func TestPlanArgsRefusesMismatches(t *testing.T) {
	fields := []field{
		vmField(true),
		{name: "n", kind: kindInteger, min: 0, max: 9},
		{name: "s", kind: kindString},
		{name: "o", kind: kindObject, fields: []field{{name: "b", kind: kindBoolean}}},
	}
	type obj struct {
		B bool `arg:"b"`
	}
	tests := []struct {
		name string
		typ  any
		want string // in the error; "" for success
	}{
		{"matching", struct {
			N int64  `arg:"n"`
			S string `arg:"s"`
			O obj    `arg:"o"`
		}{}, ""},
		{"pointers", struct {
			N *int64  `arg:"n"`
			S *string `arg:"s"`
			O *obj    `arg:"o"`
		}{}, ""},
		{"missing field", struct {
			N int64 `arg:"n"`
			O obj   `arg:"o"`
		}{}, `no field for argument "s"`},
		{"extra field", struct {
			N int64  `arg:"n"`
			S string `arg:"s"`
			O obj    `arg:"o"`
			X string `arg:"x"`
		}{}, `a field for "x", which is no argument`},
		{"vm repeated", struct {
			VM string `arg:"vm"`
			N  int64  `arg:"n"`
			S  string `arg:"s"`
			O  obj    `arg:"o"`
		}{}, `a field for "vm"`},
		{"untagged field", struct {
			N int64 `arg:"n"`
			S string
			O obj `arg:"o"`
		}{}, "has no arg tag"},
		{"int for integer", struct {
			N int    `arg:"n"`
			S string `arg:"s"`
			O obj    `arg:"o"`
		}{}, `cannot hold argument "n"`},
		{"nested mismatch", struct {
			N int64  `arg:"n"`
			S string `arg:"s"`
			O struct {
				B string `arg:"b"`
			} `arg:"o"`
		}{}, `cannot hold argument "b"`},
	}
	for _, tt := range tests {
		_, err := planArgs(reflect.TypeOf(tt.typ), fields, true)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("planArgs(%s) = %v; want success", tt.name, err)
		case tt.want != "" && (!errors.Is(err, errArgPlan) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("planArgs(%s) = %v; want errArgPlan with %q", tt.name, err, tt.want)
		}
	}
}

// TestDecodeArgs decodes validated arguments: what was given is set, a
// pointer says "given" even for an empty value, and nothing else is.
func TestDecodeArgs(t *testing.T) {
	specs := map[string]*toolSpec{}
	for _, s := range catalogue(DefaultLimits) {
		specs[s.name] = s
	}
	str := func(s string) *string { return &s }
	i64 := func(n int64) *int64 { return &n }
	no := false
	tests := []struct {
		tool, args string
		want       any
	}{
		{"vm_agent_exec", `{"vm":"lab/vm1","shell":"","session":""}`, &execArgs{Shell: str(""), Session: str("")}},
		{"vm_agent_exec", `{"vm":"lab/vm1","command":["ls","-l"],"env":{"A":"1"},"cwd":"/tmp","stdin":"x","timeout_s":5,"max_output_bytes":7,"wait":false}`,
			&execArgs{Command: []string{"ls", "-l"}, Env: map[string]string{"A": "1"}, Cwd: str("/tmp"), Stdin: str("x"), TimeoutS: 5, MaxOutputBytes: 7, Wait: &no}},
		{"kill_process", `{"vm":"lab/vm1","pid":42}`, &killArgs{PID: 42}},
		{"kill_process", `{"vm":"lab/vm1","pid":42,"signal":"KILL","started_at":17}`, &killArgs{PID: 42, Signal: "KILL", StartedAt: 17}},
		{"create_session", `{"vm":"lab/vm1","ttl_s":60,"limits":{"pids":10}}`, func() any {
			a := &createSessionArgs{TTLS: 60}
			a.Limits.Pids = 10
			return a
		}()},
		{"vm_file_write", `{"vm":"lab/vm1","path":"/f","content_base64":"","mode":0}`, &fileWriteArgs{Path: "/f", ContentBase64: str(""), Mode: i64(0)}},
		{"vm_power", `{"vm":"lab/vm1","action":"reset"}`, &powerArgs{Action: "reset"}},
		{"list_vms", `{}`, &noArgs{}},
	}
	for _, tt := range tests {
		raw, err := jsonrpc.Decode([]byte(tt.args))
		if err != nil {
			t.Fatal(err)
		}
		valid, err := specs[tt.tool].validate(raw.(map[string]any))
		if err != nil {
			t.Fatalf("%s.validate(%s) = %v", tt.tool, tt.args, err)
		}
		got, err := specs[tt.tool].decode(valid)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s.decode(%s) = %+v, %v; want %+v", tt.tool, tt.args, got, err, tt.want)
		}
	}
}

func TestDecodeArgsRefusesUnvalidated(t *testing.T) {
	spec := killProcessTool()
	for _, args := range []map[string]any{
		{"pid": "42"},
		{"pid": 42.0},
		{"signal": 9},
	} {
		if got, err := spec.decode(args); !errors.Is(err, errArgType) {
			t.Errorf("decode(%v) = %+v, %v; want errArgType", args, got, err)
		}
	}
}
