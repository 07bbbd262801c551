package config

import (
	"strings"
	"testing"
)

func TestParseHTTPLimits(t *testing.T) {
	doc := `state_dir: s
grants: [{name: a, policy: builtin:default, requests_per_minute: 6000}]
http:
  requests_per_minute: 300
  body_timeout_s: 5
  sessions: {max_per_grant: 8, max_total: 100, idle_minutes: 15}
`
	c, err := Parse([]byte(doc), t.TempDir(), "")
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	want := HTTPSessions{MaxPerGrant: 8, MaxTotal: 100, IdleMinutes: 15}
	if c.HTTP.RequestsPerMinute != 300 || c.HTTP.BodyTimeoutS != 5 || c.HTTP.Sessions != want || c.Grants[0].RequestsPerMinute != 6000 {
		t.Errorf("Parse(%q) = http %+v, grant budget %d; want 300/min, 5 s, %+v, 6000", doc, c.HTTP, c.Grants[0].RequestsPerMinute, want)
	}
}

func TestParseHTTPLimitsBad(t *testing.T) {
	base := "state_dir: s\ngrants: [{name: a, policy: p}]\n"
	tests := []struct {
		name, doc, want string
	}{
		{"negative budget", base + "http: {requests_per_minute: -1}\n", "http.requests_per_minute"},
		{"huge budget", base + "http: {requests_per_minute: 1000001}\n", "http.requests_per_minute"},
		{"negative body timeout", base + "http: {body_timeout_s: -5}\n", "http.body_timeout_s"},
		{"body timeout over an hour", base + "http: {body_timeout_s: 3601}\n", "http.body_timeout_s"},
		{"negative cap", base + "http: {sessions: {max_per_grant: -1}}\n", "http.sessions.max_per_grant"},
		{"negative total", base + "http: {sessions: {max_total: -1}}\n", "http.sessions.max_total"},
		{"idle over a week", base + "http: {sessions: {idle_minutes: 10081}}\n", "http.sessions.idle_minutes"},
		{"per grant over total", base + "http: {sessions: {max_per_grant: 10, max_total: 5}}\n", "more than max_total"},
		{"idle as a duration", base + "http: {sessions: {idle_minutes: 30m}}\n", "30m"},
		{"unknown session key", base + "http: {sessions: {max: 3}}\n", "max"},
		{"grant budget negative", "state_dir: s\ngrants: [{name: a, policy: p, requests_per_minute: -3}]\n", "grants[0].requests_per_minute"},
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

func TestParseHTTPAllowedOrigins(t *testing.T) {
	base := "state_dir: s\ngrants: [{name: a, policy: builtin:default}]\n"
	good := base + `http: {allowed_origins: ["http://localhost:6274", "https://ops.example", "http://[::1]:8080", "http://192.0.2.7:3000"]}` + "\n"
	c, err := Parse([]byte(good), t.TempDir(), "")
	if err != nil || len(c.HTTP.AllowedOrigins) != 4 {
		t.Fatalf("Parse(%q) = %v, %v; want 4 origins", good, c, err)
	}
	tests := []struct {
		name, origin, want string
	}{
		{"trailing slash", "http://localhost:6274/", "allowed_origins[0]"},
		{"a path", "https://ops.example/app", "a path"},
		{"no scheme", "localhost:6274", "http:// or https://"},
		{"another scheme", "ftp://ops.example", "http:// or https://"},
		{"a wildcard", "*", "not an origin"},
		{"null", "null", "not an origin"},
		{"uppercase host", "http://Ops.Example", "lowercase"},
		{"a user", "http://u@ops.example", "a user"},
		{"port zero", "http://ops.example:0", "bad port"},
		{"port too large", "http://ops.example:65536", "bad port"},
		{"empty port", "http://ops.example:", "bad port"},
		{"IPv6 without brackets", "http://::1", "brackets"},
		{"a query", "http://ops.example?x", "a query"},
		{"empty", "", "not an origin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := base + "http: {allowed_origins: [\"" + tt.origin + "\"]}\n"
			_, err := Parse([]byte(doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "http.allowed_origins[0]") {
				t.Errorf("Parse(%q) = %v; want an error naming http.allowed_origins[0] and containing %q", doc, err, tt.want)
			}
		})
	}
	twice := base + `http: {allowed_origins: ["http://localhost:6274", "http://localhost:6274"]}` + "\n"
	if _, err := Parse([]byte(twice), t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("Parse(%q) = %v; want an error: listed twice", twice, err)
	}
}
