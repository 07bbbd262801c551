package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:]) + fmt.Sprintf(",len:%d", len(s))
}

func TestRedact(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]any
		want map[string]any
	}{
		{"nil", nil, nil},
		{"plain arguments kept", map[string]any{"vm": "lab/vm1", "command": []any{"ls", "-l"}, "timeout_s": 5.0},
			map[string]any{"vm": "lab/vm1", "command": []any{"ls", "-l"}, "timeout_s": 5.0}},
		{"stdin", map[string]any{"stdin": "hunter2"}, map[string]any{"stdin": digest("hunter2")}},
		{"empty stdin", map[string]any{"stdin": ""}, map[string]any{"stdin": digest("")}},
		{"env values, names kept", map[string]any{"env": map[string]any{"TOKEN": "t0k", "HOME": "/root"}},
			map[string]any{"env": map[string]any{"TOKEN": digest("t0k"), "HOME": digest("/root")}}},
		{"typed env", map[string]any{"env": map[string]string{"K": "v"}}, map[string]any{"env": map[string]any{"K": digest("v")}}},
		{"content", map[string]any{"content": "file body"}, map[string]any{"content": digest("file body")}},
		{"content_base64 as sent", map[string]any{"content_base64": "aGk="}, map[string]any{"content_base64": digest("aGk=")}},
		{"typed text, keys kept", map[string]any{"text": "hunter2\n", "keys": []any{"ctrl-alt-delete"}},
			map[string]any{"text": digest("hunter2\n"), "keys": []any{"ctrl-alt-delete"}}},
		{"text in a case variant", map[string]any{"Text": "root\n"}, map[string]any{"Text": digest("root\n")}},
		{"case variant keys", map[string]any{"STDIN": "a", "Env": map[string]any{"X": "b"}, "Content": "c"},
			map[string]any{"STDIN": digest("a"), "Env": map[string]any{"X": digest("b")}, "Content": digest("c")}},
		{"nested", map[string]any{"outer": []any{map[string]any{"stdin": "deep"}}},
			map[string]any{"outer": []any{map[string]any{"stdin": digest("deep")}}}},
		{"non-string secret hashed as JSON", map[string]any{"stdin": []any{"x", 1.0}}, map[string]any{"stdin": digest(`["x",1]`)}},
		{"env not an object", map[string]any{"env": "A=secret"}, map[string]any{"env": digest("A=secret")}},
		{"env list", map[string]any{"env": []any{"A=secret"}}, map[string]any{"env": digest(`["A=secret"]`)}},
		{"env value not a string", map[string]any{"env": map[string]any{"N": 42.0}}, map[string]any{"env": map[string]any{"N": digest("42")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := json.Marshal(tt.in)
			got := Redact(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Redact(%v) = %v; want %v", tt.in, got, tt.want)
			}
			after, _ := json.Marshal(tt.in)
			if string(before) != string(after) {
				t.Fatalf("Redact mutated its input: %s became %s", before, after)
			}
		})
	}
}

func TestRedactCopiesContainers(t *testing.T) {
	cmd := []any{"echo", "x"}
	in := map[string]any{"command": cmd, "limits": map[string]any{"pids": 10.0}}
	out := Redact(in)
	out["command"].([]any)[0] = "changed"
	out["limits"].(map[string]any)["pids"] = 0.0
	if cmd[0] != "echo" || in["limits"].(map[string]any)["pids"] != 10.0 {
		t.Fatalf("Redact shares containers with its input: %v", in)
	}
}

func FuzzRedactLeaksNothing(f *testing.F) {
	f.Add("stdin", "secret-value-123")
	f.Add("ENV", "another-secret-456")
	f.Add("content_base64", "c2VjcmV0")
	f.Add("TEXT", "typed-password-789")
	f.Fuzz(func(t *testing.T, key, secret string) {
		if len(secret) < 8 || strings.Contains(digest(secret), secret) {
			return
		}
		var k string
		switch strings.ToLower(key) {
		case "stdin", "content", "content_base64", "text":
			k = key
		default:
			k = "stdin"
		}
		in := map[string]any{k: secret, "env": map[string]any{"V": secret}, "deep": map[string]any{k: []any{secret}}}
		b, err := json.Marshal(Redact(in))
		if err != nil {
			t.Fatal(err)
		}
		esc, _ := json.Marshal(secret)
		if strings.Contains(string(b), secret) || strings.Contains(string(b), string(esc[1:len(esc)-1])) {
			t.Fatalf("Redact(%v) = %s; leaks the secret", in, b)
		}
	})
}
