package main

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/vmgate/vmgate/config"
)

// TestMetricsAddrChecksHost: /metrics on its own listener (metrics.addr)
// refuses a Host that is a name other than localhost or http.allowed_hosts
// (a rebinding page's own name), and serves loopback, allowed and address
// Hosts.
func TestMetricsAddrChecksHost(t *testing.T) {
	cfg := &config.Config{Grants: []config.Grant{{Name: "g"}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for metrics.addr
	if err != nil {
		t.Fatal(err)
	}
	cfg.Metrics.Addr = ln.Addr().String()
	ln.Close()
	cfg.HTTP.AllowedHosts = []string{"metrics.lab"}
	w, err := newOperatorWeb(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := w.serveMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	tests := []struct {
		host string
		want int
	}{
		{"127.0.0.1:9707", http.StatusOK},
		{"localhost:9707", http.StatusOK},
		{"metrics.lab:9707", http.StatusOK},
		{"192.0.2.10:9707", http.StatusOK},
		{"rebind.attacker.example:9707", http.StatusForbidden},
		{"localhost.attacker.example", http.StatusForbidden},
	}
	for _, tt := range tests {
		r, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cfg.Metrics.Addr+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Host = tt.host
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatalf("GET /metrics with Host %q: %v", tt.host, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("GET /metrics with Host %q = %d; want %d", tt.host, resp.StatusCode, tt.want)
		}
	}
}
