package argview

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	tests := []struct {
		in, want string
		n        int
	}{
		{"echo hi\nls -l\tx", "echo hi\nls -l\tx", 0},
		{"a\x1b[2Kb", `a\x1b[2Kb`, 1},
		{"ok\rrm -rf /", `ok\x0drm -rf /`, 1},
		{"abc\u202edcba", `abc\u{202e}dcba`, 1},
		{"zero\u200bwidth", `zero\u{200b}width`, 1},
		{"line\u2028sep", `line\u{2028}sep`, 1},
		{"c1\u0085x", `c1\u{0085}x`, 1},
		{"bad\xffutf8", `bad\xffutf8`, 1},
		{"del\x7f", `del\x7f`, 1},
		{"naïve 日本 ✓", "naïve 日本 ✓", 0},
		{`back\slash \x41`, `back\slash \x41`, 0},
	}
	for _, tt := range tests {
		if got, n := Escape(tt.in); got != tt.want || n != tt.n {
			t.Errorf("Escape(%q) = %q, %d; want %q, %d", tt.in, got, n, tt.want, tt.n)
		}
	}
}

func TestFields(t *testing.T) {
	bin := []byte{0x7f, 'E', 'L', 'F', 0, 1, 2, 3}
	args, _ := json.Marshal(map[string]any{
		"vm":             "lab/vm1",
		"command":        []string{"sh"},
		"stdin":          "echo innocent\nrm -rf /tmp/important\n",
		"env":            map[string]string{"B": "two", "A": "$(curl evil)"},
		"content_base64": base64.StdEncoding.EncodeToString(bin),
		"timeout_s":      30,
	})
	fs, err := Fields(string(args), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Field{
		{Name: "command", Kind: KindJSON, Value: `["sh"]`, Bytes: 6, Shown: 6},
		{Name: "content_base64 (decoded)", Kind: KindHex, Value: "00000000  7f 45 4c 46 00 01 02 03                           |.ELF....|", Bytes: 8, Shown: 8},
		{Name: "stdin", Kind: KindText, Value: "echo innocent\nrm -rf /tmp/important\n", Bytes: 36, Shown: 36},
		{Name: "timeout_s", Kind: KindJSON, Value: "30", Bytes: 2, Shown: 2},
		{Name: "vm", Kind: KindText, Value: "lab/vm1", Bytes: 7, Shown: 7},
		{Name: "env.A", Kind: KindText, Value: "$(curl evil)", Bytes: 12, Shown: 12},
		{Name: "env.B", Kind: KindText, Value: "two", Bytes: 3, Shown: 3},
	}
	if len(fs) != len(want) {
		t.Fatalf("Fields = %+v; want %+v", fs, want)
	}
	for i := range want {
		if fs[i] != want[i] {
			t.Errorf("Fields[%d] = %+v; want %+v", i, fs[i], want[i])
		}
	}
}

func TestFieldsLimitAndKinds(t *testing.T) {
	long := strings.Repeat("é", 1000) // 2000 bytes
	tests := []struct {
		name      string
		args      string
		limit     int
		kind      string
		bytes     int
		shown     int
		truncated bool
		value     string
	}{
		{"long text cut on a rune boundary", `{"stdin":"` + long + `"}`, 101, KindText, 2000, 100, true, strings.Repeat("é", 50)},
		{"all of it without a limit", `{"stdin":"` + long + `"}`, 0, KindText, 2000, 2000, false, long},
		{"mostly control characters is binary", `{"stdin":"\u0001\u0002\u0003\u0004abc"}`, 0, KindHex, 7, 7, false, "00000000  01 02 03 04 61 62 63                              |....abc|"},
		{"NUL makes it binary", `{"content":"a\u0000b"}`, 0, KindHex, 3, 3, false, "00000000  61 00 62                                          |a.b|"},
		{"hidden escape stays text, shown", `{"stdin":"echo ok\u001b[1A\u001b[2Krm -rf /\n"}`, 0, KindText, 24, 24, false, `echo ok\x1b[1A\x1b[2Krm -rf /` + "\n"},
		{"base64 that does not decode is shown as sent", `{"content_base64":"not base64!"}`, 0, KindText, 11, 11, false, "not base64!"},
		{"env that is not an object", `{"env":"x"}`, 0, KindText, 1, 1, false, "x"},
		{"a name with a newline", `{"a\nb":"v"}`, 0, KindText, 1, 1, false, "v"},
	}
	for _, tt := range tests {
		fs, err := Fields(tt.args, tt.limit)
		if err != nil || len(fs) != 1 {
			t.Errorf("%s: Fields = %+v, %v; want one field", tt.name, fs, err)
			continue
		}
		f := fs[0]
		if f.Kind != tt.kind || f.Bytes != tt.bytes || f.Shown != tt.shown || f.Truncated() != tt.truncated || f.Value != tt.value || strings.ContainsAny(f.Name, "\n\x1b") {
			t.Errorf("%s: Fields = %+v; want kind %s, %d bytes, %d shown, value %q", tt.name, f, tt.kind, tt.bytes, tt.shown, tt.value)
		}
	}
	for _, bad := range []string{``, `[]`, `"x"`, `null`, `{`} {
		if _, err := Fields(bad, 0); err == nil {
			t.Errorf("Fields(%q) = nil error; want ErrNotObject", bad)
		}
	}
}

func TestOf(t *testing.T) {
	tests := []struct {
		full, redacted string
		want           string
		usedRedacted   bool
	}{
		{`{"stdin":"echo hi"}`, `{"stdin":"sha256:aa,len:7"}`, "echo hi", false},
		{"", `{"stdin":"sha256:aa,len:7"}`, "sha256:aa,len:7", true},
		{"", "", "", true},
	}
	for _, tt := range tests {
		fs, red := Of(tt.full, tt.redacted, 0)
		got := ""
		if len(fs) > 0 {
			got = fs[0].Value
		}
		if got != tt.want || red != tt.usedRedacted {
			t.Errorf("Of(%q, %q) = %q, %v; want %q, %v", tt.full, tt.redacted, got, red, tt.want, tt.usedRedacted)
		}
	}
}
