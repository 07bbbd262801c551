package strictjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// tokens lexes data to End and returns the tokens as "kind@off:text".
func tokens(l *Lexer, data string) ([]string, error) {
	l.Reset([]byte(data))
	var out []string
	for {
		t, err := l.Next()
		if err != nil {
			return out, err
		}
		s := fmt.Sprintf("%s@%d", t.Kind, t.Off)
		if t.Text != "" {
			s += ":" + t.Text
		}
		out = append(out, s)
		if t.Kind == End {
			return out, nil
		}
	}
}

func TestLexerTokens(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{`{}`, "{@0 }@1 end@2"},
		{` [ ] `, "[@1 ]@3 end@5"},
		{`{"a":1,"b":[true,false,null,"x"]}`, "{@0 key@1:a number@5:1 key@7:b [@11 true@12 false@17 null@23 string@28:x ]@31 }@32 end@33"},
		{`"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"`, "string@0:a\"\\/\b\f\n\r\t\u00e9\U0001F600 end@37"},
		{`[0,-0,1.5e-3,99999999999999999999]`, "[@0 number@1:0 number@3:-0 number@6:1.5e-3 number@13:99999999999999999999 ]@33 end@34"},
		{`{"a":{"a":{}},"b":{"a":1}}`, "{@0 key@1:a {@5 key@6:a {@10 }@11 }@12 key@14:b {@18 key@19:a number@23:1 }@24 }@25 end@26"},
	}
	var l Lexer
	for _, tt := range tests {
		got, err := tokens(&l, tt.in)
		if err != nil || strings.Join(got, " ") != tt.want {
			t.Errorf("tokens(%q) = %q, %v; want %q", tt.in, strings.Join(got, " "), err, tt.want)
		}
	}
}

// manyKeys is an object of n distinct keys k0…k(n-1) followed by extra
// members: past foldAbove keys the lexer checks case variants through foldKey.
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

func TestLexerRefuses(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name string
		in   string
		off  int
		msg  string
	}{
		{"duplicate key", `{"a":1,"a":2}`, 7, `duplicate key "a"`},
		{"case-variant key", `{"vm":"x","VM":"y"}`, 10, `key "VM" differs from key "vm" only in case`},
		{"Kelvin sign folds to k", "{\"k\":1,\"\u212a\":2}", 7, "key \"\u212a\" differs from key \"k\" only in case"},
		{"case-variant key past 16 keys", manyKeys(20, `"K3":0`), 161, `key "K3" differs from key "k3" only in case`},
		{"Kelvin sign past 16 keys", manyKeys(20, "\"\u212a3\":0"), 161, "key \"\u212a3\" differs from key \"k3\" only in case"},
		{"duplicate key past 16 keys", manyKeys(20, `"k19":0`), 161, `duplicate key "k19"`},
		{"nesting too deep", deep(DefaultMaxDepth + 1), DefaultMaxDepth, "nesting deeper than 64 levels"},
		{"trailing data", `{} {}`, 3, `unexpected '{' after the value`},
		{"lone high surrogate", `"\ud800"`, 7, "invalid surrogate pair in string"},
		{"lone low surrogate", `"\udc00x"`, 7, "invalid surrogate pair in string"},
		{"invalid UTF-8", "\"\xff\"", 1, "invalid UTF-8 in string"},
		{"invalid UTF-8 after an escape", "\"\\n\xff\"", 5, "invalid UTF-8 in string"},
		{"control character", "\"a\nb\"", 2, `control character '\n' in string`},
		{"invalid escape", `"\x41"`, 1, `invalid escape "\\x" in string`},
		{"truncated \\u", `"\u12"`, 3, `truncated \u escape in string`},
		{"bad \\u", `"\u12g4"`, 3, `invalid \u escape "12g4" in string`},
		{"leading zero", `01`, 1, `unexpected '1' after the value`},
		{"bare minus", `-`, 1, "malformed number: want a digit, got end of input"},
		{"fraction without digits", `1.`, 2, "malformed number: want a digit after '.', got end of input"},
		{"exponent without digits", `1e+`, 3, "malformed number: want a digit in the exponent, got end of input"},
		{"bad literal", `nul`, 0, `unexpected 'n', want a value`},
		{"unterminated string", `"abc`, 4, "unterminated string"},
		{"unterminated object", `{"a":1`, 6, `unexpected end of input, want ',' or '}'`},
		{"unterminated array", `[1`, 2, `unexpected end of input, want ',' or ']'`},
		{"missing colon", `{"a" 1}`, 5, `unexpected '1', want ':'`},
		{"unquoted key", `{a:1}`, 1, `unexpected 'a', want a quoted key`},
		{"trailing comma in array", `[1,]`, 3, `unexpected ']', want a value`},
		{"trailing comma in object", `{"a":1,}`, 7, `unexpected '}', want a quoted key`},
		{"wrong closer", `[1}`, 2, `unexpected '}', want ',' or ']'`},
		{"empty input", ``, 0, "unexpected end of input"},
		{"only space", " \n", 2, "unexpected end of input"},
		{"single quotes", `'a'`, 0, `unexpected '\'', want a value`},
		{"byte order mark", "\ufeff{}", 0, `unexpected '\ufeff', want a value`},
	}
	var l Lexer
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tokens(&l, tt.in)
			var se *SyntaxError
			if !errors.As(err, &se) || se.Off != tt.off || se.Msg != tt.msg {
				t.Errorf("tokens(%.60q) = %v; want SyntaxError at %d: %s", tt.in, err, tt.off, tt.msg)
			}
			if _, again := l.Next(); again != err {
				t.Errorf("Next after %v = %v; want the same error", err, again)
			}
		})
	}
}

func TestLexerDepth(t *testing.T) {
	doc := strings.Repeat("[", 3) + strings.Repeat("]", 3)
	for _, tt := range []struct {
		max int
		ok  bool
	}{{3, true}, {2, false}, {0, true}} {
		l := Lexer{MaxDepth: tt.max}
		_, err := tokens(&l, doc)
		if (err == nil) != tt.ok {
			t.Errorf("MaxDepth %d: tokens(%s) = %v; want ok %v", tt.max, doc, err, tt.ok)
		}
	}
}

func TestLexerIntern(t *testing.T) {
	var asked []string
	l := Lexer{Intern: func(b []byte) string {
		asked = append(asked, string(b))
		if string(b) == "vm" {
			return "vm"
		}
		return ""
	}}
	got, err := tokens(&l, `{"vm":"a\n","b":"c"}`)
	if err != nil || len(got) != 7 {
		t.Fatalf("tokens = %q, %v", got, err)
	}
	// Escaped strings are not offered: only escape-free ones are interned.
	if want := []string{"vm", "b", "c"}; strings.Join(asked, ",") != strings.Join(want, ",") {
		t.Errorf("Intern was asked %q; want %q", asked, want)
	}
}

// TestLexerReset reads a second document with a Lexer that failed on the
// first: nothing of the first (keys, depth, error) carries over.
func TestLexerReset(t *testing.T) {
	var l Lexer
	if _, err := tokens(&l, `{"a":{"b":[`); err == nil {
		t.Fatal("truncated document accepted")
	}
	if got, err := tokens(&l, `{"b":1}`); err != nil {
		t.Errorf("tokens after Reset = %q, %v; want success", got, err)
	}
}

func FuzzLexer(f *testing.F) {
	for _, seed := range []string{`{"a":[1,2.5e3,"x\u00e9"],"b":{"c":null}}`, `[true,false]`, `"\ud83d\ude00"`, manyKeys(20, `"x":1`)} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var l Lexer
		l.Reset(data)
		for {
			tok, err := l.Next()
			if err != nil {
				var se *SyntaxError
				if !errors.As(err, &se) || se.Off < 0 || se.Off > len(data) || se.Msg == "" {
					t.Fatalf("Next(%q) error %v; want a SyntaxError within the input", data, err)
				}
				return
			}
			if tok.Off < 0 || tok.Off > len(data) {
				t.Fatalf("token %+v of %q is outside the input", tok, data)
			}
			if tok.Kind == End {
				break
			}
		}
		// Whatever the lexer accepts, encoding/json reads too.
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("lexer accepted %q, which encoding/json refuses: %v", data, err)
		}
	})
}
