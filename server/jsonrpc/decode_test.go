package jsonrpc

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeStrictRefuses(t *testing.T) {
	// The grammar is the lexer's (internal/strictjson tests every refusal);
	// these check that Decode reports each kind as ErrMalformed.
	tests := []struct {
		name string
		in   string
	}{
		{"duplicate key", `{"a":1,"a":2}`},
		{"case-variant key", `{"vm":"x","VM":"y"}`},
		{"nesting too deep", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)},
		{"trailing data", `{} {}`},
		{"lone high surrogate", `"\ud800"`},
		{"invalid UTF-8", "\"\xff\""},
		{"control character", "\"a\nb\""},
		{"leading zero", `01`},
		{"unterminated object", `{"a":1`},
		{"empty input", ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if v, err := Decode([]byte(tt.in)); !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode(%.60q) = %v, %v; want an ErrMalformed error", tt.in, v, err)
			}
		})
	}
}

func TestDecodeStrictAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"call", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}}}`},
		{"20 distinct keys", `{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k18":18,"other":true}`},
		{"escapes", `"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"`},
		{"numbers stay as written", `[0,-0,1.5e-3,99999999999999999999]`},
		{"literals", `[true,false,null]`},
		{"nesting at the limit", strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode([]byte(tt.in))
			if err != nil {
				t.Fatalf("Decode(%.60q) = %v; want success", tt.in, err)
			}
			dec := json.NewDecoder(strings.NewReader(tt.in))
			dec.UseNumber()
			var want any
			if err := dec.Decode(&want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v, want) {
				t.Errorf("Decode(%.60q) = %#v; want %#v (encoding/json's reading)", tt.in, v, want)
			}
		})
	}
}
