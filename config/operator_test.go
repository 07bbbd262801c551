package config

import (
	"strings"
	"testing"
)

const opHash = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"

func TestParseOperatorAndMetrics(t *testing.T) {
	doc := "state_dir: s\ngrants: [{name: a, policy: p}]\noperator: {name: alice, token_sha256: " + opHash + "}\nmetrics: {addr: '127.0.0.1:9707', per_vm_labels: true}\n"
	c, err := Parse([]byte(doc), t.TempDir(), "")
	if err != nil {
		t.Fatalf("Parse(%q) = %v", doc, err)
	}
	if c.Operator.Name != "alice" || c.Operator.TokenSHA256 != opHash || c.Metrics.Addr != "127.0.0.1:9707" || !c.Metrics.PerVMLabels {
		t.Errorf("Parse(%q) = operator %+v, metrics %+v; want alice, the hash, 127.0.0.1:9707 and per-VM labels", doc, c.Operator, c.Metrics)
	}
}

func TestParseOperatorBad(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"token not hashed", "state_dir: s\ngrants: [{name: a, policy: p}]\noperator: {token_sha256: secret}\n", "operator.token_sha256"},
		{"uppercase hash", "state_dir: s\ngrants: [{name: a, policy: p}]\noperator: {token_sha256: " + strings.ToUpper(opHash) + "}\n", "operator.token_sha256"},
		{"same token as a grant", "state_dir: s\ngrants: [{name: a, policy: p, token_sha256: " + opHash + "}]\noperator: {token_sha256: " + opHash + "}\n", "same token as grant"},
		{"bad name", "state_dir: s\ngrants: [{name: a, policy: p}]\noperator: {name: 'x y', token_sha256: " + opHash + "}\n", "operator.name"},
		{"unknown operator key", "state_dir: s\ngrants: [{name: a, policy: p}]\noperator: {token: x}\n", "token"},
		{"bad metrics addr", "state_dir: s\ngrants: [{name: a, policy: p}]\nmetrics: {addr: nonsense}\n", "metrics.addr"},
		{"unknown metrics key", "state_dir: s\ngrants: [{name: a, policy: p}]\nmetrics: {path: /m}\n", "path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %v; want an error containing %q", tt.doc, err, tt.want)
			}
		})
	}
}
