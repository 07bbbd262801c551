package tools

import (
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// TestDecodeArgs decodes validated arguments: what was given is set, a
// pointer says "given" even for an empty value, and nothing else is.
func TestDecodeArgs(t *testing.T) {
	specs := map[string]*catalog.Tool{}
	for _, s := range Catalogue(catalog.DefaultLimits()) {
		specs[s.Name] = s
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
		{"list_vms", `{}`, &listVMsArgs{}},
		{"list_vms", `{"limit":5,"cursor":"c1.x","name":"web-*","state":"running","backend":"lab"}`,
			&listVMsArgs{Limit: 5, Cursor: "c1.x", Name: "web-*", State: "running", Backend: "lab"}},
		{"vm_status", `{"vm":"lab/vm1"}`, &catalog.NoArgs{}},
	}
	for _, tt := range tests {
		raw, err := jsonrpc.Decode([]byte(tt.args))
		if err != nil {
			t.Fatal(err)
		}
		valid, err := specs[tt.tool].Validate(raw.(map[string]any))
		if err != nil {
			t.Fatalf("%s.validate(%s) = %v", tt.tool, tt.args, err)
		}
		got, err := specs[tt.tool].Decode(valid)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s.decode(%s) = %+v, %v; want %+v", tt.tool, tt.args, got, err, tt.want)
		}
	}
}
