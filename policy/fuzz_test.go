package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(twentyTools()))
	f.Add([]byte(`{"version":"1","default":"deny","tools":{"kill_process":{"limits":[{"counter":"kill_process_rate","window":"minute","max":10,"scope":"grant"}]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Parse("f.json", data)
		if err != nil {
			var errs Errors
			if e != nil || !errors.As(err, &errs) || len(errs) == 0 || len(errs) > MaxErrors+1 {
				t.Fatalf("Parse error %v (%T), engine %v; want 1..%d Errors and no engine", err, err, e, MaxErrors+1)
			}
			for _, pe := range errs {
				if pe.File != "f.json" || pe.Line < 1 || pe.Col < 1 || pe.Msg == "" {
					t.Fatalf("bad error %+v", pe)
				}
			}
			return
		}
		// Whatever Parse accepts is JSON that encoding/json reads too.
		var v map[string]any
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("Parse accepted %q, which encoding/json rejects: %v", data, err)
		}
		for _, tool := range append(e.Tools(), "unlisted") {
			for _, call := range []Call{
				{Grant: "g", Tool: tool},
				{Grant: "g", Tool: tool, VM: "lab/vm1", Session: "s", Args: map[string]any{"session": "s", "n": 3.0, "l": []any{"a"}}},
			} {
				d := e.Decide(call)
				if d.Verdict == RateLimited || d.Verdict > RateLimited {
					t.Fatalf("Decide(%+v) = %v", call, d.Verdict)
				}
				if (d.Verdict == Approve) != (d.Approval != nil) {
					t.Fatalf("Decide(%+v) = %v with approval %v", call, d.Verdict, d.Approval)
				}
				if !e.Visible(tool) && d.Verdict != Deny && !d.Shadow {
					t.Fatalf("tool %q is invisible but Decide = %v", tool, d.Verdict)
				}
				for _, c := range d.Counters {
					if c.Max < 1 || c.Window <= 0 || c.Window > maxWindow || !strings.HasPrefix(c.Rule, "/") || !strings.HasPrefix(c.Key, c.Name) {
						t.Fatalf("bad counter %+v", c)
					}
				}
			}
		}
	})
}

func FuzzCondition(f *testing.F) {
	f.Add("eq", `"a"`, `"a"`)
	f.Add("lt", `5`, `"x"`)
	f.Add("regex", `"^a+$"`, `"aaa"`)
	f.Add("glob", `"lab/*"`, `"lab/x/y"`)
	f.Add("in", `[1,"a",true]`, `1`)
	f.Add("contains", `"b"`, `["a","b"]`)
	f.Add("exists", ``, `null`)
	f.Fuzz(func(t *testing.T, op, value, arg string) {
		c := `{"path":"args.x","op":` + jsonString(op)
		if value != "" {
			c += `,"value":` + value
		}
		c += `}`
		req, err := Parse("f.json", []byte(wrap(`{"require":[`+c+`]}`)))
		if err != nil {
			return
		}
		deny, err := Parse("f.json", []byte(wrap(`{"deny_if":[`+c+`]}`)))
		if err != nil {
			t.Fatalf("require accepted %s but deny_if did not: %v", c, err)
		}
		var x any
		d := json.NewDecoder(strings.NewReader(arg))
		d.UseNumber()
		args := map[string]any{}
		if d.Decode(&x) == nil {
			args["x"] = x
		}
		call := Call{Grant: "g", Tool: "t", Args: args}
		passed := req.Decide(call).Verdict == Allow
		fired := deny.Decide(call).Verdict == Deny
		if passed != fired {
			t.Fatalf("%s on %s: require passed %v, deny_if fired %v; want equal", c, arg, passed, fired)
		}
		if _, present := args["x"]; (!present || x == nil) && passed {
			t.Fatalf("%s holds for a missing value %s", c, arg)
		}
	})
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
