package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteClientsGolden(t *testing.T) {
	o := clientsOptions{config: "/etc/vmgate/vmgate.yaml", grant: "local", httpAddr: "127.0.0.1:8707", tokenEnv: "VMGATE_TOKEN", name: "vmgate", binary: "/usr/local/bin/vmgate"}
	var b bytes.Buffer
	if err := writeClients(&b, o); err != nil {
		t.Fatalf("writeClients = %v", err)
	}
	golden := filepath.Join("testdata", "clients.golden")
	if os.Getenv("VMGATE_UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read golden (VMGATE_UPDATE_GOLDEN=1 writes it): %v", err)
	}
	if b.String() != string(want) {
		t.Errorf("writeClients output differs from %s:\n%s", golden, b.String())
	}
	// Every JSON block parses, and no block holds a token: only the variable.
	for _, block := range strings.Split(b.String(), "\n\n") {
		if i := strings.Index(block, "{\n"); i >= 0 {
			var v map[string]any
			if err := json.Unmarshal([]byte(block[i:]), &v); err != nil {
				t.Errorf("JSON block does not parse: %v\n%s", err, block[i:])
			}
		}
	}
	if n := strings.Count(b.String(), "VMGATE_TOKEN"); n < 6 {
		t.Errorf("VMGATE_TOKEN appears %d times; want it in every HTTP form", n)
	}
}

func TestWriteClientsRejects(t *testing.T) {
	base := clientsOptions{grant: "local", httpAddr: "127.0.0.1:8707", tokenEnv: "VMGATE_TOKEN", name: "vmgate", binary: "vmgate"}
	tests := []struct {
		name string
		mod  func(*clientsOptions)
		want string
	}{
		{"token env with shell", func(o *clientsOptions) { o.tokenEnv = "X;rm -rf /" }, "--token-env"},
		{"empty token env", func(o *clientsOptions) { o.tokenEnv = "" }, "--token-env"},
		{"server name with quote", func(o *clientsOptions) { o.name = `vm"gate` }, "--name"},
		{"http without port", func(o *clientsOptions) { o.httpAddr = "localhost" }, "--http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.mod(&o)
			var b bytes.Buffer
			err := writeClients(&b, o)
			if err == nil || !strings.Contains(err.Error(), tt.want) || b.Len() != 0 {
				t.Errorf("writeClients(%+v) = %v, %d bytes; want an error naming %s and no output", o, err, b.Len(), tt.want)
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/usr/bin/vmgate", "/usr/bin/vmgate"},
		{"/my dir/vmgate", "'/my dir/vmgate'"},
		{"it's", `'it'\''s'`},
		{"", "''"},
		{"$(reboot)", "'$(reboot)'"},
	}
	for _, tt := range tests {
		if got := shellQuote(tt.in); got != tt.want {
			t.Errorf("shellQuote(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}
