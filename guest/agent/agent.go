//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// SessionEnv is the environment marker every process of a session carries.
const SessionEnv = "VMGATE_SESSION"

// RunEnv marks every process of one run (found by the timeout's tree kill).
const RunEnv = "VMGATE_RUN"

// cgroupParent is the cgroup (under the cgroup v2 root) holding every session group.
const cgroupParent = "vmgate"

// Config says where the agent's state lives. The zero value is not valid;
// use DefaultConfig.
type Config struct {
	// Root holds sessions/<id> (workdirs), meta/<id>.json, tmp/<id> (the
	// sandboxes' private temporary directories), netns/<id> (their network
	// namespaces) and the lock file.
	Root string
	// CgroupRoot is the cgroup v2 mount; "" disables cgroup tracking.
	CgroupRoot string
	// ProcDir is the proc mount.
	ProcDir string
	// Self is the path of this binary (for the rlimit shim); "" means /proc/self/exe.
	Self string
	// UIDBase and UIDCount are the range sandboxed sessions' uids and gids
	// come from; 0 means DefaultUIDBase and DefaultUIDCount.
	UIDBase, UIDCount int
	// Grace is how long a tree kill waits after SIGTERM before SIGKILL.
	Grace time.Duration
	// Logger receives diagnostics; never stdout.
	Logger *slog.Logger
}

// DefaultConfig is the guest's real layout.
func DefaultConfig() Config {
	return Config{
		Root:       "/var/lib/vmgate",
		CgroupRoot: "/sys/fs/cgroup",
		ProcDir:    "/proc",
		Grace:      300 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// Agent carries out the commands. Run per command it holds no state
// between commands; the resident helper (Serve) adds its jobs (res).
type Agent struct {
	cfg    Config
	proc   procFS
	faults fileFaults // tests only: failures injected into file writes
	// res is the resident helper's state; nil in a process per command.
	// Set once by Serve before it serves.
	res *resident
}

// New returns an Agent for cfg.
func New(cfg Config) (*Agent, error) {
	if cfg.Root == "" || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("agent: root %q must be an absolute path", cfg.Root)
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.Self == "" {
		cfg.Self = "/proc/self/exe"
	}
	if cfg.UIDBase <= 0 || cfg.UIDCount <= 0 {
		cfg.UIDBase, cfg.UIDCount = DefaultUIDBase, DefaultUIDCount
	}
	if cfg.UIDBase+cfg.UIDCount > 1<<31-1 {
		return nil, fmt.Errorf("agent: uid range %d+%d goes past 2^31-1", cfg.UIDBase, cfg.UIDCount)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 300 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return &Agent{cfg: cfg, proc: procFS{dir: cfg.ProcDir}}, nil
}

func (a *Agent) sessionsDir() string { return filepath.Join(a.cfg.Root, "sessions") }
func (a *Agent) metaDir() string     { return filepath.Join(a.cfg.Root, "meta") }
func (a *Agent) tmpDir() string      { return filepath.Join(a.cfg.Root, "tmp") }
func (a *Agent) netnsDir() string    { return filepath.Join(a.cfg.Root, "netns") }

// Error constructors: the reply's code says what kind of failure it was.
func invalidf(format string, args ...any) error {
	return &wire.Error{Code: wire.CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

func refused(reason, format string, args ...any) error {
	return &wire.Error{Code: wire.CodeRefused, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func notFoundf(format string, args ...any) error {
	return &wire.Error{Code: wire.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// VersionInfo describes this build.
func VersionInfo() wire.Version {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return wire.Version{Version: v, GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
}

// Main runs one command line (without the program name) and writes one
// wire.Reply to stdout, followed by the command's data output when it goes
// inline (see files_stage.go for --in and --out, the data flags that may
// come before the command). It returns the process exit status: 0 ok, 1
// when the reply is an error, 2 when the reply could not be written.
func (a *Agent) Main(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) int {
	d, args, err := a.dataFlags(args, stdin)
	var res any
	if err == nil {
		res, err = a.dispatch(ctx, args, d)
	}
	var tail []byte
	reply := wire.Reply{OK: err == nil, Result: res}
	if err == nil && d.out != nil {
		reply.Data, tail, err = d.out.finish()
	}
	d.close(err != nil)
	if err != nil {
		var we *wire.Error
		if !errors.As(err, &we) {
			we = &wire.Error{Code: wire.CodeFailed, Message: err.Error()}
		} else if we.Message != err.Error() {
			we = &wire.Error{Code: we.Code, Reason: we.Reason, Message: err.Error()}
		}
		reply = wire.Reply{Error: we}
		tail = nil
	}
	if werr := json.NewEncoder(stdout).Encode(reply); werr != nil {
		a.cfg.Logger.Error("writing reply", "err", werr)
		return 2
	}
	if _, werr := stdout.Write(tail); werr != nil {
		a.cfg.Logger.Error("writing reply data", "err", werr)
		return 2
	}
	if err != nil {
		return 1
	}
	return 0
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return invalidf("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return invalidf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// decodeStrict decodes exactly one JSON value with no unknown fields.
func decodeStrict(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

func (a *Agent) dispatch(ctx context.Context, args []string, d *dataIO) (any, error) {
	if len(args) == 0 {
		return nil, invalidf("usage: vmgate-guest [--in PIECES] [--out MODE] version|hello|ps|run|job|kill|session|file|dir|archive|metrics|install ...")
	}
	stdin := d.in
	switch cmd, rest := args[0], args[1:]; cmd {
	case "version":
		fs := newFlags("version")
		fs.Bool("json", true, "JSON output (always)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return VersionInfo(), nil
	case "ps":
		fs := newFlags("ps")
		session := fs.String("session", "", "only this session's processes")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.PS(ctx, *session)
	case "run":
		if err := parseFlags(newFlags("run"), rest); err != nil {
			return nil, err
		}
		req, err := readRunRequest("run", stdin)
		if err != nil {
			return nil, err
		}
		return a.Run(ctx, req)
	case "kill":
		fs := newFlags("kill")
		pid := fs.Int("pid", 0, "process id")
		sig := fs.String("signal", "TERM", "signal name")
		started := fs.Int64("started-at", 0, "expected start time, ms since the epoch (0: unchecked)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.Kill(ctx, *pid, *sig, *started)
	case "hello":
		if err := parseFlags(newFlags("hello"), rest); err != nil {
			return nil, err
		}
		return a.Hello()
	case "job":
		return a.jobCommand(ctx, rest, stdin)
	case "install":
		fs := newFlags("install")
		dir := fs.String("unit-dir", "/etc/systemd/system", "where the systemd unit goes")
		noStart := fs.Bool("no-start", false, "write the unit only")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.Install(ctx, *dir, !*noStart)
	case "session":
		return a.sessionCommand(ctx, rest)
	case "file":
		return a.fileCommand(ctx, rest, d)
	case "dir":
		return a.dirCommand(ctx, rest)
	case "archive":
		return a.archiveCommand(ctx, rest, d)
	case "metrics":
		fs := newFlags("metrics")
		sample := fs.Int64("sample-ms", wire.DefaultMetricsSampleMS, "CPU sample, ms")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if *sample < 0 || *sample > wire.MaxMetricsSampleMS {
			return nil, invalidf("metrics: --sample-ms %d: want 0..%d", *sample, wire.MaxMetricsSampleMS)
		}
		return a.Metrics(ctx, time.Duration(*sample)*time.Millisecond)
	}
	return nil, invalidf("unknown command %q", args[0])
}

// readRunRequest reads one wire.RunRequest (strictly) from stdin.
func readRunRequest(op string, stdin io.Reader) (wire.RunRequest, error) {
	var req wire.RunRequest
	dec := json.NewDecoder(io.LimitReader(stdin, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, invalidf("%s: request on stdin: %v", op, err)
	}
	if dec.More() {
		return req, invalidf("%s: request on stdin: trailing data", op)
	}
	return req, nil
}

func (a *Agent) sessionCommand(ctx context.Context, args []string) (any, error) {
	if len(args) == 0 {
		return nil, invalidf("usage: vmgate-guest session create|list|destroy|restore|reap")
	}
	switch sub, rest := args[0], args[1:]; sub {
	case "create":
		fs := newFlags("session create")
		var req wire.SessionCreate
		fs.StringVar(&req.ID, "id", "", "session id")
		fs.Int64Var(&req.TTLS, "ttl-s", 0, "time to live, seconds")
		fs.Int64Var(&req.IdleS, "idle-s", 0, "idle time, seconds")
		fs.Int64Var(&req.Limits.MemoryMB, "memory-mb", 0, "memory limit")
		fs.Int64Var(&req.Limits.Pids, "pids", 0, "process limit")
		fs.Int64Var(&req.Limits.CPUPercent, "cpu-percent", 0, "CPU limit, 100 = one CPU")
		sandbox := fs.String("sandbox", "", "the sandbox, as wire.Sandbox JSON (none: unconfined)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if *sandbox != "" {
			req.Sandbox = new(wire.Sandbox)
			if err := decodeStrict(*sandbox, req.Sandbox); err != nil {
				return nil, invalidf("session create: --sandbox: %v", err)
			}
		}
		return a.SessionCreate(ctx, req)
	case "list":
		if err := parseFlags(newFlags("session list"), rest); err != nil {
			return nil, err
		}
		return a.SessionList(ctx)
	case "destroy":
		fs := newFlags("session destroy")
		id := fs.String("id", "", "session id")
		trash := fs.Int64("trash-s", 0, "keep the workdir in the trash this long, seconds (0: remove it)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if *trash < 0 || *trash > wire.MaxTrashS {
			return nil, invalidf("session destroy: --trash-s %d: want 0..%d", *trash, wire.MaxTrashS)
		}
		return a.SessionTrash(ctx, *id, time.Duration(*trash)*time.Second)
	case "restore":
		fs := newFlags("session restore")
		id := fs.String("id", "", "the live session that gets the files")
		from := fs.String("from", "", "the destroyed session whose files are in the trash")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.SessionRestore(ctx, *id, *from)
	case "reap":
		if err := parseFlags(newFlags("session reap"), rest); err != nil {
			return nil, err
		}
		return a.SessionReap(ctx)
	}
	return nil, invalidf("unknown session command %q", args[0])
}
