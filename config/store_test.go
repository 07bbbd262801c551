package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const sentinelDoc = `state_dir: s
grants: [{name: a, policy: p}]
store:
  type: redis
  prefix: "vm:"
  sentinel:
    master: vmgate
    addrs: ["10.0.0.1:26379", "10.0.0.2:26379", "[fd00::3]:26379"]
    password_file: secrets/redis.pass
    ack_timeout_ms: 50
metrics: {replica: gate-1}
`

func TestParseSentinel(t *testing.T) {
	dir := t.TempDir()
	c, err := Parse([]byte(sentinelDoc), dir, "")
	if err != nil {
		t.Fatalf("Parse(sentinel) = %v", err)
	}
	sn := c.Store.Sentinel
	if sn == nil || sn.Master != "vmgate" || !slices.Equal(sn.Addrs, []string{"10.0.0.1:26379", "10.0.0.2:26379", "[fd00::3]:26379"}) || sn.AckTimeoutMS != 50 {
		t.Fatalf("store.sentinel = %+v; want master vmgate, three addrs, ack 50 ms", sn)
	}
	if want := filepath.Join(dir, "secrets", "redis.pass"); sn.PasswordFile != want {
		t.Errorf("password_file = %q; want %q (relative to the config file)", sn.PasswordFile, want)
	}
	if sn.SentinelPasswordFile != "" {
		t.Errorf("sentinel_password_file = %q; want empty", sn.SentinelPasswordFile)
	}
	if got := c.ReplicaLabel(); got != "gate-1" {
		t.Errorf("ReplicaLabel() = %q; want gate-1", got)
	}
}

// TestParseStoreBad: every mistake in the store section is an error naming
// the field and its line.
func TestParseStoreBad(t *testing.T) {
	const head = "state_dir: s\ngrants: [{name: a, policy: p}]\n"
	tests := []struct {
		name, doc, want string
	}{
		{"redis without url or sentinel", "store: {type: redis}\n", "store.url: required for type redis (one server), or store.sentinel (a primary Sentinel watches) (line 3)"},
		{"url and sentinel", "store:\n  type: redis\n  url: redis://h:6379\n  sentinel: {master: m, addrs: ['h:1']}\n", "store.sentinel: url and sentinel are two ways to reach Redis: give one (line 6)"},
		{"sentinel on bolt", "store:\n  type: bolt\n  sentinel: {master: m, addrs: ['h:1']}\n", "store: url, prefix and sentinel are for type redis, not bolt (line 4)"},
		{"no master", "store:\n  type: redis\n  sentinel: {addrs: ['h:1']}\n", `store.sentinel.master: "": want the name`},
		{"bad master", "store:\n  type: redis\n  sentinel:\n    master: 'a b'\n    addrs: ['h:1']\n", `store.sentinel.master: "a b": want the name the Sentinels monitor the primary under ([A-Za-z0-9._-], at most 64) (line 6)`},
		{"no addrs", "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: []\n", "store.sentinel.addrs: 0 addresses: want 1 to 16 Sentinels (three or more on separate hosts) (line 7)"},
		{"addr without port", "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs:\n      - h:1\n      - h\n", `store.sentinel.addrs[1]: "h" is not host:port (line 9)`},
		{"addr port out of range", "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: ['h:70000']\n", `store.sentinel.addrs[0]: "h:70000": port "70000" is not a number from 1 to 65535 (line 7)`},
		{"addr without host", "store:\n  type: redis\n  sentinel: {master: m, addrs: [':26379']}\n", `store.sentinel.addrs[0]: ":26379" is not host:port (line 5)`},
		{"duplicate addr", "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: ['h:1', 'h:1']\n", `store.sentinel.addrs[1]: "h:1" is also addrs[0] (line 7)`},
		{"ack timeout", "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: ['h:1']\n    ack_timeout_ms: 20000\n", "store.sentinel.ack_timeout_ms: 20000 out of range [0, 10000] (0 means the default, 250) (line 8)"},
		{"unknown sentinel key", "store:\n  type: redis\n  sentinel: {master: m, addrs: ['h:1'], password: x}\n", "field password not found"},
		{"addrs not a list", "store:\n  type: redis\n  sentinel: {master: m, addrs: 'h:1'}\n", "cannot unmarshal"},
		{"bad replica label", "metrics: {replica: 'a b'}\n", `metrics.replica: "a b": want 1 to 128 of [A-Za-z0-9._:@-] (line 3)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(head+tt.doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %v; want an error containing %q", tt.doc, err, tt.want)
			}
		})
	}
}

func TestReplicaLabelDefault(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || !replicaRE.MatchString(host) {
		host = "unknown" // a host name that is no label value is not used
	}
	tests := []struct {
		store, want string
	}{
		{"store: {type: redis, url: 'redis://h:1'}\n", host},
		{"store: {type: bolt}\n", ""},
		{"store: {type: memory}\n", ""},
	}
	for _, tt := range tests {
		c, err := Parse([]byte("state_dir: s\ngrants: [{name: a, policy: p}]\n"+tt.store), t.TempDir(), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ReplicaLabel(); got != tt.want {
			t.Errorf("ReplicaLabel() with %q = %q; want %q", tt.store, got, tt.want)
		}
	}
}

func TestSentinelPasswords(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "pa ss\n", 0o600)
	tests := []struct {
		name               string
		file, sentinelFile string
		redis, sentinel    string
		bad                bool // errPasswordFile
		fails              bool // any error
	}{
		{name: "none"},
		{name: "both", file: good, sentinelFile: write("s", "other", 0o400), redis: "pa ss", sentinel: "other"},
		{name: "crlf", file: write("crlf", "pw\r\n", 0o600), redis: "pw"},
		{name: "group readable", file: write("g", "pw", 0o640), bad: true},
		{name: "world readable sentinel file", file: good, sentinelFile: write("w", "pw", 0o604), bad: true},
		{name: "empty", file: write("e", "\n", 0o600), bad: true},
		{name: "two lines", file: write("two", "a\nb\n", 0o600), bad: true},
		{name: "nul", file: write("nul", "a\x00b", 0o600), bad: true},
		{name: "too long", file: write("long", strings.Repeat("x", MaxPasswordFileSize+1), 0o600), bad: true},
		{name: "directory", file: dir, bad: true},
		{name: "missing", file: filepath.Join(dir, "nope"), fails: true},
	}
	for _, tt := range tests {
		sn := &Sentinel{PasswordFile: tt.file, SentinelPasswordFile: tt.sentinelFile}
		r, s, err := sn.Passwords()
		switch {
		case tt.bad && !errors.Is(err, errPasswordFile):
			t.Errorf("%s: Passwords() = %v; want errPasswordFile", tt.name, err)
		case tt.fails && err == nil:
			t.Errorf("%s: Passwords() = nil; want an error", tt.name)
		case (tt.bad || tt.fails) && (r != "" || s != ""):
			t.Errorf("%s: Passwords() returned %q, %q with its error", tt.name, r, s)
		case !tt.bad && !tt.fails && (err != nil || r != tt.redis || s != tt.sentinel):
			t.Errorf("%s: Passwords() = %q, %q, %v; want %q, %q", tt.name, r, s, err, tt.redis, tt.sentinel)
		}
		if err != nil && strings.Contains(err.Error(), "pa ss") {
			t.Errorf("%s: the error %q holds a password", tt.name, err)
		}
	}
}
