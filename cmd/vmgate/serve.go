package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/policy/store/redis"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/stdio"
)

func init() { commands = append(commands, newServeCmd) }

type serveOptions struct {
	config           string
	grant            string
	grantSet         bool // --grant was given: serve stdio even when the config has http.addr
	httpAddr         string
	allowNonLoopback bool
	grace            time.Duration
	inProcess        bool
	cpuProfile       string
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the MCP server (stdio by default, --http for streamable HTTP)",
		Long: `serve runs the MCP server. Over stdio (the default) it serves one client as
the grant named by --grant. With --http ADDR it serves streamable HTTP at
/mcp; every request needs "Authorization: Bearer <token>" whose SHA-256 is a
grant's token_sha256. It binds loopback addresses only, unless TLS is
configured or --allow-non-loopback is given.

Without --config the embedded defaults apply: state, bbolt store and audit
log in the state directory, the lab VMs as backend "lab", and grant "local"
with the built-in policy.

Without --http, a config with http.addr is served over HTTP there, unless
--grant is given (stdio as that grant).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.grantSet = cmd.Flags().Changed("grant")
			return runServe(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.config, "config", "", "config file (vmgate.yaml); default: embedded defaults")
	cmd.Flags().StringVar(&o.grant, "grant", "local", "grant of the stdio client")
	cmd.Flags().StringVar(&o.httpAddr, "http", "", "serve streamable HTTP on ADDR (e.g. 127.0.0.1:8707) instead of stdio")
	cmd.Flags().BoolVar(&o.allowNonLoopback, "allow-non-loopback", false, "allow --http on a non-loopback address without TLS")
	cmd.Flags().BoolVar(&o.inProcess, "in-process", false, "run the built-in drivers inside the server instead of as plugin processes (debugging)")
	cmd.Flags().DurationVar(&o.grace, "grace", 10*time.Second, "how long calls in flight may finish at shutdown before they are cancelled")
	cmd.Flags().StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the server to FILE until it exits (also $"+cpuProfileEnv+")")
	_ = cmd.Flags().MarkHidden("cpuprofile")
	return cmd
}

func loadConfig(path string) (*config.Config, error) {
	stateDir, err := lab.DefaultStateDir()
	if err != nil && path == "" {
		return nil, fmt.Errorf("serve: state directory: %w", err)
	}
	if path == "" {
		return config.Default(stateDir), nil
	}
	return config.Load(path, stateDir)
}

// warnNoBackends says so at start when the config (read from path) has no
// backends: the server would answer every list_vms with none and give no
// other sign.
func warnNoBackends(log *slog.Logger, cfg *config.Config, path string) {
	if len(cfg.Backends) > 0 {
		return
	}
	log.Warn("serve: the config has no backends, so there is no VM to use; add a backends section (qemu, libvirt, virtualbox or proxmox)", "config", path)
}

// chooseTransport settles stdio or HTTP: --http; else http.addr of the
// config unless --grant is given; else stdio as --grant, which must be a
// grant of cfg. HTTP with no grant holding a token is warned of.
func (o *serveOptions) chooseTransport(cfg *config.Config) error {
	if o.httpAddr == "" && !o.grantSet {
		o.httpAddr = cfg.HTTP.Addr
	}
	if o.httpAddr != "" {
		warnNoTokens(slog.Default(), cfg)
		return nil
	}
	if err := checkGrant(cfg, o.config, o.grant); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// openAuditLog opens the config's audit log; when another process holds
// it, the error says what to do instead.
func openAuditLog(cfg *config.Config) (*audit.Log, error) {
	log, err := audit.Open(cfg.Audit.Path, audit.Options{KeyFile: cfg.Audit.KeyFile, Fsync: cfg.Audit.Fsync})
	if errors.Is(err, audit.ErrInUse) {
		return nil, fmt.Errorf("serve: audit log: %w; another vmgate serve runs on the state directory %s: "+
			"use it (vmgate call --url http://ADDR/mcp, or connect your client to it), or give this one another state directory "+
			"(state_dir in the config, or VMGATE_STATE_DIR without one)", err, cfg.StateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("serve: audit log: %w", err)
	}
	return log, nil
}

// warnNoTokens says so at start when HTTP is served and no grant has a
// token_sha256: every request would get 401 and nothing else would say why.
func warnNoTokens(log *slog.Logger, cfg *config.Config) {
	for _, g := range cfg.Grants {
		if g.TokenSHA256 != "" {
			return
		}
	}
	log.Warn("serve: no grant has a token_sha256, so every HTTP request is refused (401); "+
		"give a grant one (README: Install) or serve stdio (--grant NAME without --http)", "grants", len(cfg.Grants))
}

func runServe(ctx context.Context, o serveOptions) (err error) {
	setGCPercent(os.Getenv("GOGC"))
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProfile()) }()
	cfg, engines, grants, err := prepareServe(&o)
	if err != nil {
		return err
	}
	log, err := openAuditLog(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := log.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("serve: close audit log: %w", cerr))
		}
	}()
	st, err := openStore(ctx, cfg, log.Path())
	if err != nil {
		return err
	}
	defer st.Close()

	backends, closeDrivers, err := launchBackends(ctx, cfg, o.inProcess)
	if err != nil {
		return err
	}
	// Registered before the server exists, so it runs after srv.Close has
	// drained the calls in flight: then every plugin is stopped and waited for.
	defer func() {
		if cerr := closeDrivers(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("serve: stop drivers: %w", cerr))
		}
	}()
	web, err := newOperatorWeb(cfg, backends) // metrics and the /ui page (operatorweb.go)
	if err != nil {
		return err
	}
	countedStore, countedLog := web.wrap(st, log)
	srv, err := server.New(server.Config{
		Grants: grants, Backends: backends, Store: countedStore, Audit: countedLog,
		Templates:    cfg.Templates, // the store keeps the leases and snapshot owners (the metrics wrapper passes them on)
		AuditRecords: func(fn func(audit.Record) error) error { return audit.Read(log.Path(), fn) },
		Limits:       catalog.Limits{MaxOutputBytes: cfg.Limits.MaxOutputBytes, MaxTimeoutS: cfg.Limits.MaxTimeoutS},
		Version:      version, ShutdownGrace: o.grace,
	})
	if err != nil {
		return err
	}
	web.srv = srv
	defer func() {
		if cerr := srv.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	return serveServer(ctx, srv, web, cfg, engines, o)
}

// prepareServe loads the config, checks the state directory, loads
// every grant's policy and settles the transport (o.httpAddr): what serve
// needs before it opens anything.
func prepareServe(o *serveOptions) (*config.Config, map[string]*policy.Engine, []server.Grant, error) {
	cfg, err := loadConfig(o.config)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, lab.DirMode); err != nil {
		return nil, nil, nil, fmt.Errorf("serve: state directory: %w", err)
	}
	// Refused, not tightened: the operator may have opened it on purpose,
	// and should know that what was in it could be read.
	if err := lab.CheckStateDir(cfg.StateDir); err != nil {
		return nil, nil, nil, fmt.Errorf("serve: %w", err)
	}
	engines, err := loadPolicies(cfg.Grants)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("serve: %w", err)
	}
	warnNoBackends(slog.Default(), cfg, o.config)
	grants := make([]server.Grant, 0, len(cfg.Grants))
	for _, g := range cfg.Grants {
		warnUnknownTools(slog.Default(), g.Name, engines[g.Name])
		grants = append(grants, server.Grant{Name: g.Name, TokenSHA256: g.TokenSHA256, Policy: engines[g.Name], VMs: g.VMs, RequestsPerMinute: g.RequestsPerMinute})
	}
	if err := o.chooseTransport(cfg); err != nil {
		return nil, nil, nil, err
	}
	return cfg, engines, grants, nil
}

// serveServer serves srv until ctx ends or its stdio input does: the
// operator socket, the metrics listener, policy reloads on SIGHUP and when
// a policy file changes, and the MCP transport (stdio, or HTTP on
// --http).
func serveServer(ctx context.Context, srv *server.Server, web *operatorWeb, cfg *config.Config, engines map[string]*policy.Engine, o serveOptions) error {
	stopOperator, err := startOperator(ctx, srv, cfg.StateDir)
	if err != nil {
		return err
	}
	defer stopOperator()
	stopMetrics, err := web.serveMetrics(ctx)
	if err != nil {
		return err
	}
	defer stopMetrics()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloadCtx, stopReload := context.WithCancel(ctx)
	defer stopReload()
	go newPolicyReloader(cfg.Grants, engines, srv.SetPolicy, slog.Default()).run(reloadCtx, hup, policyPollInterval)

	addr := o.httpAddr
	if addr == "" {
		slog.Info("vmgate: serving MCP on stdio", "grant", o.grant, "state", cfg.StateDir)
		return stdio.Serve(ctx, srv, o.grant, os.Stdin, os.Stdout)
	}
	return serveHTTP(ctx, srv, web, cfg, addr, o)
}

// checkGrant says why name is no grant of cfg, listing the grants there
// are, or returns nil when it is one.
func checkGrant(cfg *config.Config, configPath, name string) error {
	names := make([]string, 0, len(cfg.Grants))
	for _, g := range cfg.Grants {
		if g.Name == name {
			return nil
		}
		names = append(names, strconv.Quote(g.Name))
	}
	where := "the config " + configPath
	if configPath == "" {
		where = "the embedded defaults (no --config)"
	}
	return fmt.Errorf("--grant %q is not a grant of %s; its grants: %s", name, where, strings.Join(names, ", "))
}

// openStore opens the configured store. With bolt (the default) counters
// live in memory and approvals in bbolt (memory.Split; its package doc has
// the reasons and the figures): the audit log's decision records are the
// counters' write-ahead log, replayed here. bbolt fsyncs its commits, which
// only approvals make. Redis is the replicas' shared source of truth and
// is used as it is.
func openStore(ctx context.Context, cfg *config.Config, auditPath string) (store.Store, error) {
	switch cfg.Store.Type {
	case config.StoreMemory:
		m := memory.New()
		return m, restoreCounters(ctx, auditPath, m.Restore)
	case config.StoreRedis:
		r, err := openRedis(cfg.Store)
		if err != nil {
			return nil, fmt.Errorf("serve: store: %w", err)
		}
		return r, nil
	default:
		b, err := bolt.Open(cfg.Store.Path, bolt.Options{})
		if err != nil {
			return nil, fmt.Errorf("serve: store: %w", err)
		}
		s, err := memory.NewSplit(b)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("serve: store: %w", err)
		}
		if err := restoreCounters(ctx, auditPath, s.Restore); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
}

// openRedis opens the Redis store: one server (url), or the primary the
// Sentinels watch (sentinel), with the passwords from their files.
func openRedis(st config.Store) (*redis.Store, error) {
	sn := st.Sentinel
	if sn == nil {
		return redis.Open(st.URL, redis.Options{Prefix: st.Prefix})
	}
	pw, spw, err := sn.Passwords()
	if err != nil {
		return nil, err
	}
	return redis.OpenSentinel(redis.Sentinel{Master: sn.Master, Addrs: sn.Addrs, Password: pw, SentinelPassword: spw},
		redis.Options{Prefix: st.Prefix, AckTimeout: time.Duration(sn.AckTimeoutMS) * time.Millisecond})
}

// serveGCPercent is the garbage collector's target for `vmgate serve` when
// GOGC is not set. The server's live heap is small (a few MiB), so at Go's
// default of 100 it collects every few hundred calls, and the collections
// cost about 5 µs of CPU per call (docs/performance.md); 400 collects a
// quarter as often for about 12 MiB more of resident memory.
const serveGCPercent = 400

// setGCPercent applies serveGCPercent unless the user set GOGC (gogc is its
// value), which the runtime has applied already.
func setGCPercent(gogc string) {
	if gogc == "" {
		debug.SetGCPercent(serveGCPercent)
	}
}

// restoreCounters replays the reservations the audit log says are still
// live (audit.Reservations: decision records inside their windows whose
// outcome does not say refunded, and the units of advances a power loss may
// have cut short).
func restoreCounters(ctx context.Context, path string, restore func(context.Context, string, time.Time, []policy.Counter) error) error {
	rs, err := audit.Reservations(path, time.Now())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("serve: rebuild counters from the audit log: %w", err)
	}
	for _, r := range rs {
		if err := restore(ctx, r.ID, r.At, r.Counters); err != nil && !errors.Is(err, store.ErrDuplicate) {
			return fmt.Errorf("serve: restore counters of %s: %w", r.ID, err)
		}
	}
	if len(rs) > 0 {
		slog.Info("vmgate: restored reservations from the audit log", "reservations", len(rs))
	}
	return nil
}

func serveHTTP(ctx context.Context, srv *server.Server, web *operatorWeb, cfg *config.Config, addr string, o serveOptions) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("serve: --http %q: %w", addr, err)
	}
	tlsOn := cfg.HTTP.TLSCert != ""
	if !isLoopback(host) && !tlsOn && !o.allowNonLoopback {
		return fmt.Errorf("serve: refusing to serve plain HTTP on non-loopback %q: configure http.tls_cert/tls_key or pass --allow-non-loopback", addr)
	}
	handler, err := web.handler(srv, tlsOn)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	hs := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() {
		if tlsOn {
			errc <- hs.ServeTLS(ln, cfg.HTTP.TLSCert, cfg.HTTP.TLSKey)
		} else {
			errc <- hs.Serve(ln)
		}
	}()
	slog.Info("vmgate: serving MCP over streamable HTTP", "url", scheme(tlsOn)+"://"+ln.Addr().String()+"/mcp")
	select {
	case err := <-errc:
		return fmt.Errorf("serve: http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.grace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		slog.Warn("vmgate: calls still running after the grace period were cut off", "err", err)
		hs.Close()
	}
	<-errc
	return nil
}

func scheme(tls bool) string {
	if tls {
		return "https"
	}
	return "http"
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// launchBackends starts every backend's driver through the plugin host:
// as a plugin process by default, inside the server for --in-process or a
// backend with in_process: true. A backend that cannot start is an error
// and nothing is left running: serving without it would turn its VMs into
// "unknown VM" with nothing but a log line to say why, and a plugin that
// cannot start at boot (bad settings, missing executable, failed handshake)
// does not heal by itself. The returned function stops every driver.
func launchBackends(ctx context.Context, cfg *config.Config, inProcess bool) ([]server.Backend, func() error, error) {
	opts := pluginhost.Options{Logger: slog.Default(), Registry: pluginhost.Registered(), PluginDir: cfg.PluginDir}
	plugins := pluginhost.New(opts)
	opts.InProcess = true
	local := pluginhost.New(opts)
	closeAll := func() error { return errors.Join(plugins.Close(), local.Close()) }

	backends := make([]server.Backend, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		host := plugins
		if (inProcess || b.InProcess) && config.IsBuiltin(b.Driver) {
			host = local
		}
		d, err := host.Launch(ctx, pluginhost.Spec{Driver: b.Driver, Backend: b.Name, Config: b.DriverConfig})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("serve: backend %s (driver %s): %w", b.Name, b.Driver, err)
		}
		if s, ok := d.(*pluginhost.Supervisor); ok {
			slog.Info("vmgate: backend driver started as a plugin", "backend", b.Name, "driver", b.Driver, "pid", s.PID())
		}
		backends = append(backends, server.Backend{Name: b.Name, Driver: d})
	}
	return backends, closeAll, nil
}
