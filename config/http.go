package config

import (
	"fmt"

	"github.com/vmgate/vmgate/internal/hostguard"
)

// HTTPSessions bound the sessions of the streamable HTTP transport (MCP
// clients older than protocol 2026-07-28; newer ones have none). Zero
// values take the server's defaults: 64 per grant, 1024 in all, 30 idle
// minutes. A grant's new session beyond its cap evicts its least recently
// used one; beyond the total, the least recently used session of the grant
// holding the most is evicted.
type HTTPSessions struct {
	MaxPerGrant int `yaml:"max_per_grant"`
	MaxTotal    int `yaml:"max_total"`
	IdleMinutes int `yaml:"idle_minutes"`
}

// The ranges of the HTTP limits.
const (
	maxRequestsPerMinute = 1_000_000
	maxBodyTimeoutS      = 3600
	maxSessionsTotal     = 1_000_000
	maxIdleMinutes       = 7 * 24 * 60
)

// validateHTTPLimits checks the HTTP budget, body timeout and session caps.
func (c *Config) validateHTTPLimits() error {
	h := c.HTTP
	inRange := func(field string, v, hi int) error {
		if v < 0 || v > hi {
			return fmt.Errorf("%s: %d out of range [0, %d] (0 means the default)", field, v, hi)
		}
		return nil
	}
	checks := []struct {
		field string
		v, hi int
	}{
		{"http.requests_per_minute", h.RequestsPerMinute, maxRequestsPerMinute},
		{"http.body_timeout_s", h.BodyTimeoutS, maxBodyTimeoutS},
		{"http.sessions.max_per_grant", h.Sessions.MaxPerGrant, maxSessionsTotal},
		{"http.sessions.max_total", h.Sessions.MaxTotal, maxSessionsTotal},
		{"http.sessions.idle_minutes", h.Sessions.IdleMinutes, maxIdleMinutes},
	}
	for _, ck := range checks {
		if err := inRange(ck.field, ck.v, ck.hi); err != nil {
			return err
		}
	}
	if h.Sessions.MaxPerGrant > 0 && h.Sessions.MaxTotal > 0 && h.Sessions.MaxPerGrant > h.Sessions.MaxTotal {
		return fmt.Errorf("http.sessions.max_per_grant: %d is more than max_total %d", h.Sessions.MaxPerGrant, h.Sessions.MaxTotal)
	}
	for i, g := range c.Grants {
		if err := inRange(fmt.Sprintf("grants[%d].requests_per_minute", i), g.RequestsPerMinute, maxRequestsPerMinute); err != nil {
			return err
		}
	}
	return nil
}

// validateHTTPOrigins checks http.allowed_origins: each an origin exactly
// as a browser sends it in the Origin header (the server compares them
// byte for byte), listed once; "*" and "null" are not origins.
func (c *Config) validateHTTPOrigins() error {
	seen := map[string]bool{}
	for i, o := range c.HTTP.AllowedOrigins {
		if _, _, err := hostguard.ParseOrigin(o); err != nil {
			return fmt.Errorf("http.allowed_origins[%d]: %w; write scheme://host[:port] as a browser sends it, e.g. \"http://localhost:6274\"", i, err)
		}
		if seen[o] {
			return fmt.Errorf("http.allowed_origins[%d]: %q is listed twice", i, o)
		}
		seen[o] = true
	}
	return nil
}
