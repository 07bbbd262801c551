package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/internal/hostguard"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/mcphttp"
	"github.com/vmgate/vmgate/server/metrics"
	"github.com/vmgate/vmgate/server/tools"
	"github.com/vmgate/vmgate/server/ui"
)

// operatorWeb is the operator's side of `vmgate serve`: the metrics (always
// counted; served on metrics.addr, or at /metrics on the HTTP listener
// behind the operator token) and the approvals page at /ui (when the config
// has an operator token).
type operatorWeb struct {
	cfg      *config.Config
	backends []server.Backend
	metrics  *metrics.Metrics
	store    store.Store
	// srv is the server, once made (serve sets it before anything is
	// served): the notifications it dropped are counted.
	srv *server.Server
}

// newOperatorWeb builds the metrics for the config's grants and backends.
func newOperatorWeb(cfg *config.Config, backends []server.Backend) (*operatorWeb, error) {
	w := &operatorWeb{cfg: cfg, backends: backends}
	grants := make([]string, len(cfg.Grants))
	for i, g := range cfg.Grants {
		grants[i] = g.Name
	}
	mb := make([]metrics.Backend, len(backends))
	for i, b := range backends {
		mb[i] = metrics.Backend{Name: b.Name, Driver: b.Driver}
	}
	m, err := metrics.New(metrics.Options{
		Tools: tools.Names(), Grants: grants, Backends: mb, Replica: cfg.ReplicaLabel(), PerVMLabels: cfg.Metrics.PerVMLabels,
		PendingApprovals: func(ctx context.Context) (int, error) {
			if w.store == nil {
				return 0, errors.New("no store")
			}
			now := time.Now()
			list, err := w.store.ListApprovals(ctx, now)
			n := 0
			for _, a := range list {
				if a.State == store.ApprovalPending && now.Before(a.Expires) {
					n++
				}
			}
			return n, err
		},
		NotificationsDropped: func() uint64 {
			if w.srv == nil {
				return 0
			}
			return w.srv.NotificationsDropped()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	w.metrics = m
	return w, nil
}

// wrap returns the store and audit log the server uses: st and a counted.
func (w *operatorWeb) wrap(st store.Store, a server.Auditor) (store.Store, server.Auditor) {
	w.store = w.metrics.Store(st)
	return w.store, w.metrics.Auditor(a)
}

// serveMetrics serves /metrics on metrics.addr when it is set, until ctx
// ends; stop shuts the listener down and waits for it.
func (w *operatorWeb) serveMetrics(ctx context.Context) (stop func(), err error) {
	addr := w.cfg.Metrics.Addr
	if addr == "" {
		return func() {}, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("serve: metrics.addr %q: %w", addr, err)
	}
	if !isLoopback(host) {
		slog.Warn("vmgate: metrics listen on a non-loopback address without authentication", "addr", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsHostGuard(w.cfg.HTTP.AllowedHosts, w.metrics.Handler()))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("vmgate: metrics listener", "err", err)
		}
	}()
	slog.Info("vmgate: serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		<-done
	}, nil
}

// handler mounts /ui and (without metrics.addr) /metrics beside the MCP
// handler of srv on the HTTP listener; every request's body must arrive
// within the configured body timeout.
func (w *operatorWeb) handler(srv *server.Server, tlsOn bool) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle("/", mcphttp.New(srv, httpOptions(w.cfg.HTTP)))
	bodyTimeout := httpOptions(w.cfg.HTTP).BodyTimeout
	if w.cfg.Operator.TokenSHA256 == "" {
		slog.Info("vmgate: no operator token in the config: the approvals page /ui is off")
		return mcphttp.LimitBodyTime(mux, bodyTimeout), nil
	}
	backends := make([]ui.Backend, len(w.backends))
	for i, b := range w.backends {
		backends[i] = ui.Backend{Name: b.Name, Driver: b.Driver}
	}
	page, err := ui.New(ui.Config{
		Approvals: srv.Approvals(), AuditPath: w.cfg.Audit.Path, Backends: backends,
		TokenSHA256: w.cfg.Operator.TokenSHA256, OperatorName: w.cfg.Operator.Name, Secure: tlsOn,
		AllowedHosts: w.cfg.HTTP.AllowedHosts, AllowedOrigins: w.cfg.HTTP.AllowedOrigins,
		Tighten: w.tighten(srv),
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	mux.Handle(ui.Prefix+"/", page)
	mux.Handle(ui.Prefix, http.RedirectHandler(ui.Prefix+"/", http.StatusSeeOther))
	if w.cfg.Metrics.Addr == "" {
		mux.Handle("/metrics", page.OperatorOnly(w.metrics.Handler()))
	}
	return mcphttp.LimitBodyTime(mux, bodyTimeout), nil
}

// tighten is what the page's tightening section needs: the grants, their
// policies in force (after any reload) and the catalogue, as `vmgate policy
// suggest` and `vmgate policy diff` take them.
func (w *operatorWeb) tighten(srv *server.Server) *ui.Tighten {
	grants := make([]string, len(w.cfg.Grants))
	for i, g := range w.cfg.Grants {
		grants[i] = g.Name
	}
	return &ui.Tighten{Grants: grants, Policy: srv.Policy, Tools: offlineTools(), Defaults: tools.ArgsWithDefaults, Catalogue: tools.Names()}
}

// metricsHostGuard refuses a /metrics request on metrics.addr whose Host is
// a name other than localhost or http.allowed_hosts (DNS rebinding from a
// browser on the host); an address literal passes, so a scraper on another
// machine reaching a non-loopback metrics.addr by its address works.
func metricsHostGuard(allowed []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostguard.AllowedOrAddress(r.Host, allowed) {
			http.Error(w, "forbidden host", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
