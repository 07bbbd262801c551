package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// manyKeys is an object of n distinct keys k0…k(n-1) followed by extra
// members: past 16 keys the reader checks case variants through foldKey.
func manyKeys(n int, extra string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	b.WriteString(extra)
	b.WriteByte('}')
	return b.String()
}

func TestDecodeStrictRefuses(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"duplicate key", `{"a":1,"a":2}`},
		{"case-variant key", `{"vm":"x","VM":"y"}`},
		{"Kelvin sign folds to k", "{\"k\":1,\"\u212a\":2}"},
		{"case-variant key past 16 keys", manyKeys(20, `"K3":0`)},
		{"Kelvin sign past 16 keys", manyKeys(20, "\"\u212a3\":0")},
		{"duplicate key past 16 keys", manyKeys(20, `"k19":0`)},
		{"nesting too deep", strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)},
		{"trailing data", `{} {}`},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00x"`},
		{"invalid UTF-8", "\"\xff\""},
		{"control character", "\"a\nb\""},
		{"invalid escape", `"\x41"`},
		{"truncated \\u", `"\u12"`},
		{"leading zero", `01`},
		{"bare minus", `-`},
		{"fraction without digits", `1.`},
		{"exponent without digits", `1e+`},
		{"bad literal", `nul`},
		{"unterminated string", `"abc`},
		{"unterminated object", `{"a":1`},
		{"missing colon", `{"a" 1}`},
		{"trailing comma", `[1,]`},
		{"empty input", ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if v, err := decodeStrict([]byte(tt.in)); !errors.Is(err, errJSON) {
				t.Errorf("decodeStrict(%.60q) = %v, %v; want an errJSON error", tt.in, v, err)
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
		{"20 distinct keys", manyKeys(20, `"other":true`)},
		{"escapes", `"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"`},
		{"numbers stay as written", `[0,-0,1.5e-3,99999999999999999999]`},
		{"literals", `[true,false,null]`},
		{"nesting at the limit", strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := decodeStrict([]byte(tt.in))
			if err != nil {
				t.Fatalf("decodeStrict(%.60q) = %v; want success", tt.in, err)
			}
			dec := json.NewDecoder(strings.NewReader(tt.in))
			dec.UseNumber()
			var want any
			if err := dec.Decode(&want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v, want) {
				t.Errorf("decodeStrict(%.60q) = %#v; want %#v (encoding/json's reading)", tt.in, v, want)
			}
		})
	}
}
