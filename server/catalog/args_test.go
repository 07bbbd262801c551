package catalog

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestPlanArgsRefusesMismatches(t *testing.T) {
	fields := []Field{
		VMField(true),
		{Name: "n", Kind: KindInteger, Min: 0, Max: 9},
		{Name: "s", Kind: KindString},
		{Name: "o", Kind: KindObject, Fields: []Field{{Name: "b", Kind: KindBoolean}}},
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

// TestDecodeRefusesUnvalidated: arguments that skipped Validate (of
// another type than their field's kind) are an error, never a zero value.
func TestDecodeRefusesUnvalidated(t *testing.T) {
	type killArgs struct {
		PID    int64  `arg:"pid"`
		Signal string `arg:"signal"`
	}
	tool := NewTool(Tool{Name: "kill", Fields: []Field{
		VMField(true),
		{Name: "pid", Kind: KindInteger, Required: true, Min: 1, Max: 9},
		{Name: "signal", Kind: KindString},
	}}, func(*Env, *Call, *killArgs) Result { return Result{} })
	for _, args := range []map[string]any{
		{"pid": "42"},
		{"pid": 42.0},
		{"signal": 9},
	} {
		if got, err := tool.Decode(args); !errors.Is(err, errArgType) {
			t.Errorf("Decode(%v) = %+v, %v; want errArgType", args, got, err)
		}
	}
}
