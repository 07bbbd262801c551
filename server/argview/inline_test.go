package argview

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

func TestInline(t *testing.T) {
	pad := strings.Repeat(" ", 420)
	tests := []struct {
		in, want string
		n        int
	}{
		// Issue 29, finding 6: a tail behind a run of spaces.
		{"echo 'routine log rotation'" + pad + "&& echo TAIL > /data/x", "echo 'routine log rotation'⟦420 spaces⟧&& echo TAIL > /data/x", 1},
		{"a  b", "a  b", 0},
		{"a   b", "a⟦3 spaces⟧b", 1},
		{"trailing   ", "trailing⟦3 spaces⟧", 1},
		{"l1\nl2\tx", `l1\nl2\tx`, 2},
		{"ok\rrm -rf /", `ok\x0drm -rf /`, 1},
		{"a\x1b[2Kb", `a\x1b[2Kb`, 1},
		{"abc\u202edcba", `abc\u{202e}dcba`, 1},
		{"zero\u200bwidth\u2060joiner", `zero\u{200b}width\u{2060}joiner`, 2},
		{"no\u00a0break", `no\u{00a0}break`, 1},
		{"ideo\u3000graphic\u2003em", `ideo\u{3000}graphic\u{2003}em`, 2},
		{"forged ⟦9 spaces⟧ marker", `forged \u{27e6}9 spaces\u{27e7} marker`, 2},
		{"bad\xffutf8", `bad\xffutf8`, 1},
		{"naïve 日本 ✓", "naïve 日本 ✓", 0},
		{"", "", 0},
	}
	for _, tt := range tests {
		got, n := Inline(tt.in)
		if got != tt.want || n != tt.n {
			t.Errorf("Inline(%q) = %q, %d; want %q, %d", tt.in, got, n, tt.want, tt.n)
		}
		if strings.ContainsAny(got, "\n\r\t") || strings.Contains(got, "   ") {
			t.Errorf("Inline(%q) = %q holds a line break, a tab or a run of spaces", tt.in, got)
		}
	}
}

func TestInlineFields(t *testing.T) {
	bin := []byte{0x7f, 'E', 'L', 'F', 0, 1}
	args, _ := json.Marshal(map[string]any{
		"command":        []string{"sh", "-c", "x    y"},
		"stdin":          "line one\nline two",
		"content_base64": base64.StdEncoding.EncodeToString(bin),
		"env":            map[string]string{"A\nB": "plain text\u202e"},
	})
	fs, err := InlineFields(string(args))
	if err != nil {
		t.Fatal(err)
	}
	want := []Field{
		{Name: "command", Kind: KindJSON, Value: `["sh","-c","x⟦4 spaces⟧y"]`, Bytes: 20, Shown: 20, Escaped: 1},
		{Name: "content_base64 (decoded)", Kind: KindHex, Value: "7f 45 4c 46 00 01", Bytes: 6, Shown: 6},
		{Name: "stdin", Kind: KindText, Value: `line one\nline two`, Bytes: 17, Shown: 17, Escaped: 1},
		{Name: `env.A\nB`, Kind: KindText, Value: `plain text\u{202e}`, Bytes: 13, Shown: 13, Escaped: 1},
	}
	if len(fs) != len(want) {
		t.Fatalf("InlineFields = %+v; want %+v", fs, want)
	}
	for i := range want {
		if fs[i] != want[i] {
			t.Errorf("InlineFields[%d] = %+v; want %+v", i, fs[i], want[i])
		}
	}
}
