package policy

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// wrap puts a tool body into a one-line document; the body starts at column 50.
func wrap(body string) string {
	return `{"version":"1","default":"deny","tools":{"t":` + body + `}}`
}

func TestParseErrors(t *testing.T) {
	lim := func(fields string) string { return wrap(`{"limits":[{` + fields + `}]}`) }
	cond := func(c string) string { return wrap(`{"require":[` + c + `]}`) }
	cases := []struct {
		name string
		doc  string
		at   string // the error is at the first occurrence of at in doc ("" is 1:1)
		want string // "path: message" (a prefix of it)
	}{
		{"empty", ``, "", `unexpected end of input`},
		{"not an object", `[]`, "", `want an object, got array`},
		{"trailing data", `{"version":"1","default":"deny"} x`, "x", `unexpected 'x' after the value`},
		{"duplicate key", `{"version":"1","version":"1","default":"deny"}`, `"version":"1","default"`, `duplicate key "version"`},
		{"case-variant key", `{"version":"1","default":"deny","Tools":{}}`, `"Tools"`, `Tools: unknown field "Tools" (field names are case-sensitive: did you mean "tools"?)`},
		{"case-duplicate tool", wrap(`{},"T":{}`), `"T"`, `key "T" differs from key "t" only in case`},
		{"unknown field", `{"version":"1","default":"deny","tool":{}}`, `"tool"`, `tool: unknown field "tool"`},
		{"default missing", `{"version":"1"}`, "", `default: required field is missing`},
		{"version missing", `{"default":"deny"}`, "", `version: required field is missing`},
		{"version 2", `{"version":"2","default":"deny"}`, `"2"`, `version: unsupported version "2"`},
		{"version number", `{"version":1,"default":"deny"}`, `1`, `version: want a string, got number`},
		{"bad default", `{"version":"1","default":"maybe"}`, `"maybe"`, `default: unknown default "maybe"`},
		{"bad mode", `{"version":"1","default":"deny","mode":"loud"}`, `"loud"`, `mode: unknown mode "loud"`},
		{"tools not object", `{"version":"1","default":"deny","tools":[]}`, `[]`, `tools: want an object of tools, got array`},
		{"bad tool name", `{"version":"1","default":"deny","tools":{"a b":{}}}`, `"a b"`, `tools["a b"]: tool name "a b" has the character ' '`},
		{"hide and configure", `{"version":"1","default":"deny","hide":["t"],"tools":{"t":{}}}`, `"t":`, `tools.t: tool "t" is both hidden and configured`},
		{"hide twice", `{"version":"1","default":"deny","hide":["t","t"]}`, `"t"]`, `hide[1]: tool "t" is hidden twice`},
		{"unknown action", wrap(`{"action":"maybe"}`), `"maybe"`, `tools.t.action: unknown action "maybe"`},
		{"approval without approve", wrap(`{"approval":{}}`), `{}`, `tools.t.approval: approval is set but the action is not "approve"`},
		{"bad channel", wrap(`{"action":"approve","approval":{"channel":"email"}}`), `"email"`, `tools.t.approval.channel: unknown channel "email"`},
		{"bad ttl", wrap(`{"action":"approve","approval":{"ttl":"0s"}}`), `"0s"`, `tools.t.approval.ttl: ttl 0s is out of range`},
		{"long reason", wrap(`{"reason":"` + strings.Repeat("x", 1025) + `"}`), `"xx`, `tools.t.reason: reason is 1025 bytes`},
		{"unknown window", lim(`"counter":"c","window":"minit","max":1,"scope":"grant"`), `"minit"`, `tools.t.limits[0].window: unknown window "minit"`},
		{"zero window", lim(`"counter":"c","window":"0s","max":1,"scope":"grant"`), `"0s"`, `tools.t.limits[0].window: window "0s" is out of range`},
		{"negative window", lim(`"counter":"c","window":"-5s","max":1,"scope":"grant"`), `"-5s"`, `tools.t.limits[0].window: window "-5s" is out of range`},
		{"huge window", lim(`"counter":"c","window":"200h","max":1,"scope":"grant"`), `"200h"`, `tools.t.limits[0].window: window "200h" is out of range`},
		{"max -1", lim(`"counter":"c","window":"minute","max":-1,"scope":"grant"`), `-1`, `tools.t.limits[0].max: max -1 is out of range`},
		{"max 0", lim(`"counter":"c","window":"minute","max":0,"scope":"grant"`), `0,`, `tools.t.limits[0].max: max 0 is out of range`},
		{"max 1e309", lim(`"counter":"c","window":"minute","max":1e309,"scope":"grant"`), `1e309`, `tools.t.limits[0].max: number 1e309 is out of range`},
		{"max 2.5", lim(`"counter":"c","window":"minute","max":2.5,"scope":"grant"`), `2.5`, `tools.t.limits[0].max: want an integer, got 2.5`},
		{"max string", lim(`"counter":"c","window":"minute","max":"10","scope":"grant"`), `"10"`, `tools.t.limits[0].max: want an integer, got string`},
		{"max missing", lim(`"counter":"c","window":"minute","scope":"grant"`), `{"counter"`, `tools.t.limits[0].max: required field is missing`},
		{"unknown scope", lim(`"counter":"c","window":"minute","max":1,"scope":"tenant"`), `"tenant"`, `tools.t.limits[0].scope: unknown scope "tenant"`},
		{"scope twice", lim(`"counter":"c","window":"minute","max":1,"scope":["vm","vm"]`), `"vm"]`, `tools.t.limits[0].scope[1]: scope "vm" is listed twice`},
		{"empty scope", lim(`"counter":"c","window":"minute","max":1,"scope":[]`), `[]`, `tools.t.limits[0].scope: empty scope list`},
		{"global with grant", lim(`"counter":"c","window":"minute","max":1,"scope":["global","grant"]`), `["global"`, `tools.t.limits[0].scope: scope "global" cannot be combined`},
		{"bad counter name", lim(`"counter":"a|b","window":"minute","max":1,"scope":"grant"`), `"a|b"`, `tools.t.limits[0].counter: counter name "a|b" has the character '|'`},
		{"counter redefined", wrap(`{"limits":[{"counter":"c","window":"minute","max":1,"scope":"grant"},{"counter":"c","window":"hour","max":1,"scope":"vm"}]}`), `{"counter":"c","window":"hour"`, `tools.t.limits[1]: counter "c" is defined at /tools/t/limits/0 with window 1m0s and max 1`},
		{"limits not array", wrap(`{"limits":{}}`), `{}}`, `tools.t.limits: want an array of limits, got object`},
		{"unknown op", cond(`{"path":"vm","op":"like","value":"x"}`), `"like"`, `tools.t.require[0].op: unknown op "like"`},
		{"unknown path", cond(`{"path":"env.HOME","op":"exists"}`), `"env.HOME"`, `tools.t.require[0].path: unknown path "env.HOME"`},
		{"empty path name", cond(`{"path":"args..x","op":"exists"}`), `"args..x"`, `tools.t.require[0].path: path "args..x" has an empty name`},
		{"exists with value", cond(`{"path":"vm","op":"exists","value":1}`), `1}`, `tools.t.require[0].value: op exists takes no value`},
		{"value missing", cond(`{"path":"vm","op":"eq"}`), `{"path"`, `tools.t.require[0].value: required field is missing (op eq needs a value)`},
		{"lt on string value", cond(`{"path":"args.n","op":"lt","value":"5"}`), `"5"`, `tools.t.require[0].value: want a number, got string`},
		{"value 1e309", cond(`{"path":"args.n","op":"gt","value":1e309}`), `1e309`, `tools.t.require[0].value: number 1e309 is out of range`},
		{"in not a list", cond(`{"path":"vm","op":"in","value":"a"}`), `"a"`, `tools.t.require[0].value: want a list, got string`},
		{"in with object", cond(`{"path":"vm","op":"in","value":["a",{}]}`), `{}]`, `tools.t.require[0].value: want a string, number or boolean, got object`},
		{"eq null", cond(`{"path":"vm","op":"eq","value":null}`), `null`, `tools.t.require[0].value: want a string, number or boolean, got null`},
		{"bad regex", cond(`{"path":"vm","op":"regex","value":"(a"}`), `"(a"`, `tools.t.require[0].value: bad regex: missing closing )`},
		{"long regex", cond(`{"path":"vm","op":"regex","value":"` + strings.Repeat("a", 1025) + `"}`), `"aa`, `tools.t.require[0].value: pattern is 1025 bytes; the limit is 1024`},
		{"bad glob", cond(`{"path":"vm","op":"glob","value":"lab/["}`), `"lab/["`, `tools.t.require[0].value: bad glob "lab/["`},
		{"double star glob", cond(`{"path":"vm","op":"glob","value":"lab/**"}`), `"lab/**"`, `tools.t.require[0].value: bad glob "lab/**": "**" is not supported`},
		{"deny_if not list", wrap(`{"deny_if":{}}`), `{}}`, `tools.t.deny_if: want an array of conditions, got object`},
		{"deep nesting", wrap(`{"require":[{"path":"vm","op":"eq","value":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}]}`), strings.Repeat("[", 13) + "]", `nesting deeper than 32 levels`},
		{"bad escape", `{"version":"1","default":"d\x"}`, `\x`, `invalid escape "\\x" in string`},
		{"control char", "{\"version\":\"1\n\"}", "\n", `control character '\n' in string`},
		{"leading zero", `{"version":01}`, `1}`, `unexpected '1', want ',' or '}'`},
		{"invalid utf-8", "{\"version\":\"\xff\"}", "\xff", `document is not valid UTF-8`},
		{"second line", "{\"version\":\"1\",\n  \"default\": 7}", "7", `default: want a string, got number`},
		{"too large", `{"version":"1","default":"deny","hide":[` + strings.Repeat(`"x",`, MaxDocumentSize/4) + `"x"]}`, "", `document is 1048621 bytes; the limit is 1048576`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Parse("policy.json", []byte(tc.doc))
			if e != nil {
				t.Errorf("Parse returned an Engine with error %v", err)
			}
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("Parse error = %v (%T); want Errors", err, err)
			}
			want := "policy.json:" + position(t, tc.doc, tc.at) + ": " + tc.want
			if got := errs[0].Error(); !strings.HasPrefix(got, want) {
				t.Errorf("Parse first error = %q; want prefix %q", got, want)
			}
		})
	}
}

func TestParseCollectsAllErrors(t *testing.T) {
	doc := "{\n" +
		`  "version": "2",` + "\n" +
		`  "default": "deny",` + "\n" +
		`  "tools": {` + "\n" +
		`    "kill_process": {` + "\n" +
		`      "limits": [ { "counter": "k", "window": "minit", "max": -1, "scope": "tenant" } ]` + "\n" +
		`    },` + "\n" +
		`    "x": { "Action": "deny" }` + "\n" +
		"  }\n}\n"
	_, err := Parse("p.json", []byte(doc))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error = %v; want Errors", err)
	}
	want := []string{
		`p.json:2:14: version: unsupported version "2" (want "1")`,
		`p.json:6:47: tools.kill_process.limits[0].window: unknown window "minit" (want second, minute, hour, day or a duration like "90s")`,
		`p.json:6:63: tools.kill_process.limits[0].max: max -1 is out of range (want 1 to 1000000000; use "action": "deny" to forbid a tool)`,
		`p.json:6:76: tools.kill_process.limits[0].scope: unknown scope "tenant" (want grant, session, vm, template or global)`,
		`p.json:8:12: tools.x.Action: unknown field "Action" (field names are case-sensitive: did you mean "action"?)`,
	}
	if len(errs) != len(want) {
		t.Fatalf("Parse gave %d errors:\n%v\nwant %d", len(errs), err, len(want))
	}
	for i := range want {
		if got := errs[i].Error(); got != want[i] {
			t.Errorf("error %d = %q; want %q", i, got, want[i])
		}
	}
}

func TestParseCapsErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"version":"1","default":"deny","tools":{`)
	for i := range 200 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"t` + strings.Repeat("x", i) + `":{"action":"nope"}`)
	}
	b.WriteString(`}}`)
	_, err := Parse("p.json", []byte(b.String()))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error = %v; want Errors", err)
	}
	if len(errs) != MaxErrors+1 || !strings.HasSuffix(errs[MaxErrors].Error(), "too many errors") {
		t.Errorf("Parse gave %d errors, last %q; want %d and \"too many errors\"", len(errs), errs[len(errs)-1], MaxErrors+1)
	}
}

func TestParseLargeObjectIsLinear(t *testing.T) {
	// Many distinct keys go through the map path of the duplicate check;
	// a case-variant duplicate at the end must still be found.
	var b strings.Builder
	b.WriteString(`{"version":"1","default":"deny","tools":{`)
	for i := range 5000 {
		b.WriteString(`"t` + itoa(i) + `":{},`)
	}
	b.WriteString(`"T42":{}}}`)
	_, err := Parse("p.json", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), `key "T42" differs from key "t42" only in case`) {
		t.Errorf("Parse error = %v; want the case-variant key T42", err)
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func TestParseWindowsAndScopes(t *testing.T) {
	cases := []struct {
		window string
		scope  string
		want   Counter
	}{
		{`"second"`, `"global"`, Counter{Key: "c", Window: time.Second}},
		{`"hour"`, `"vm"`, Counter{Key: "c|vm=7:lab/vm1", Window: time.Hour}},
		{`"day"`, `["vm","grant"]`, Counter{Key: "c|grant=1:g|vm=7:lab/vm1", Window: 24 * time.Hour}},
		{`"90s"`, `["session","grant","vm"]`, Counter{Key: "c|grant=1:g|session=2:s1|vm=7:lab/vm1", Window: 90 * time.Second}},
	}
	for _, tc := range cases {
		e := mustParse(t, wrap(`{"limits":[{"counter":"c","window":`+tc.window+`,"max":3,"scope":`+tc.scope+`}]}`))
		d := e.Decide(Call{Grant: "g", Tool: "t", VM: "lab/vm1", Session: "s1"})
		tc.want.Name, tc.want.Max, tc.want.Rule = "c", 3, "/tools/t/limits/0"
		if len(d.Counters) != 1 || d.Counters[0] != tc.want {
			t.Errorf("window %s scope %s: Counters = %+v; want [%+v]", tc.window, tc.scope, d.Counters, tc.want)
		}
	}
}

// position is "line:col" of the first occurrence of at in doc (1:1 for "").
func position(t *testing.T, doc, at string) string {
	t.Helper()
	i := strings.Index(doc, at)
	if i < 0 {
		t.Fatalf("marker %q is not in the document", at)
	}
	line := 1 + strings.Count(doc[:i], "\n")
	col := 1 + utf8.RuneCountInString(doc[strings.LastIndex(doc[:i], "\n")+1:i])
	return strconv.Itoa(line) + ":" + strconv.Itoa(col)
}
