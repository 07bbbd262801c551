// Package wire is the JSON contract between vmgate-guest (guest/agent) and
// the host (internal/guestctl): the request and result types, the reply envelope,
// and the pure validators both sides share (session ids, signal names).
// It imports only the standard library, so the host side builds anywhere.
package wire

import (
	"errors"
	"fmt"
	"strings"
)

// Error codes carried in Reply.Error.Code.
const (
	// CodeInvalid: the request was refused before any side effect.
	CodeInvalid = "invalid_argument"
	// CodeRefused: a guard refused the operation (Reason says which).
	CodeRefused = "refused"
	// CodeNotFound: no such process or session.
	CodeNotFound = "not_found"
	// CodeExists: the session already exists.
	CodeExists = "exists"
	// CodeFailed: the guest could not do it (I/O, cgroup, kill loop gave up).
	CodeFailed = "failed"
)

// Refusal reasons of kill (Error.Reason when Code is CodeRefused).
const (
	ReasonInit          = "pid 1 is init"
	ReasonKernelThread  = "kernel thread"
	ReasonGuestAgent    = "guest agent"
	ReasonSelf          = "vmgate-guest itself"
	ReasonPidReused     = "pid was reused"
	ReasonAncestor      = "ancestor of vmgate-guest"
	ReasonNotInSession  = "process is not in the session"
	ReasonNoCgroupLimit = "limit needs cgroup v2"
	// File refusals (file read, write, stat; dir list; archive write
	// entries): see files.go for the rest.
	ReasonSymlink     = "symlink in the path"
	ReasonNotRegular  = "not a regular file"
	ReasonSpecialBits = "setuid, setgid or sticky bits"
	ReasonHardlink    = "file has other hard links"
)

// Reply is the one JSON object vmgate-guest writes to stdout.
type Reply struct {
	OK     bool   `json:"ok"`
	Result any    `json:"result,omitempty"`
	Error  *Error `json:"error,omitempty"`
	// Data says where a command's data output is (file read, archive
	// read): after the reply's line on stdout, or in staging files.
	Data *DataOut `json:"data,omitempty"`
}

// Error is a failed command's reason.
type Error struct {
	Code    string `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Process is one row of ps.
type Process struct {
	PID        int32   `json:"pid"`
	PPID       int32   `json:"ppid"`
	User       string  `json:"user"`
	Name       string  `json:"name"`
	Cmdline    string  `json:"cmdline"`
	StartedAt  int64   `json:"started_at"` // ms since the Unix epoch
	State      string  `json:"state"`      // one letter of /proc/P/stat: R S D Z T I ...
	RSSBytes   uint64  `json:"rss_bytes"`
	CPUPercent float64 `json:"cpu_percent"` // average over the process's lifetime, 100 = one CPU
	Session    string  `json:"session,omitempty"`
}

// RunRequest is what `vmgate-guest run` reads from stdin.
// Exactly one of Argv and Shell is set.
type RunRequest struct {
	Argv    []string          `json:"argv,omitempty"`
	Shell   string            `json:"shell,omitempty"` // run as /bin/sh -c Shell
	Cwd     string            `json:"cwd,omitempty"`   // default: the session workdir, else /
	Env     map[string]string `json:"env,omitempty"`
	Stdin   []byte            `json:"stdin,omitempty"`
	Session string            `json:"session,omitempty"`
	// TimeoutMS bounds the run; 0 means DefaultRunTimeoutMS. At most MaxRunTimeoutMS.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes caps each of stdout and stderr; 0 means DefaultMaxOutputBytes.
	// At most MaxOutputBytesLimit.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// Sandbox, without Session, runs the command alone in a sandbox of
	// its own (a one-shot session, created for it and destroyed with every
	// process it left once it ends), as create_session's sandbox would.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}

// Run limits.
const (
	DefaultRunTimeoutMS   = 10 * 60 * 1000
	MaxRunTimeoutMS       = 24 * 60 * 60 * 1000
	DefaultMaxOutputBytes = 1 << 20
	MaxOutputBytesLimit   = 8 << 20
)

// RunResult is what run returns.
type RunResult struct {
	PID             int    `json:"pid"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	// Killed is how many processes the timeout's tree kill signalled.
	Killed     int   `json:"killed,omitempty"`
	DurationMS int64 `json:"duration_ms"`
	// WriteBlocked, for a command of a sandboxed session that failed, is
	// the session's Enforced.WriteBlocked: write paths its uid cannot
	// write for the files' own permissions, which a refusal may come from.
	WriteBlocked []BlockedPath `json:"write_blocked,omitempty"`
}

// KillResult is what kill returns.
type KillResult struct {
	PID    int    `json:"pid"`
	Signal string `json:"signal"`
	// Exited: the process was gone (or a zombie) before the poll ended.
	Exited bool `json:"exited"`
	// State is the process state letter at the end of the poll when it did not exit.
	State    string `json:"state,omitempty"`
	WaitedMS int64  `json:"waited_ms"`
}

// Limits are a session's resource limits; 0 means none.
type Limits struct {
	MemoryMB   int64 `json:"memory_mb,omitempty"`
	Pids       int64 `json:"pids,omitempty"`
	CPUPercent int64 `json:"cpu_percent,omitempty"` // 100 = one CPU
}

// Validate checks the limits' ranges.
func (l Limits) Validate() error {
	if l.MemoryMB < 0 || l.MemoryMB > 1<<20 {
		return fmt.Errorf("memory_mb %d out of range 0..%d", l.MemoryMB, 1<<20)
	}
	if l.MemoryMB > 0 && l.MemoryMB < 4 {
		return fmt.Errorf("memory_mb %d below the minimum of 4", l.MemoryMB)
	}
	if l.Pids < 0 || l.Pids > 1<<22 {
		return fmt.Errorf("pids %d out of range 0..%d", l.Pids, 1<<22)
	}
	if l.CPUPercent < 0 || l.CPUPercent > 100*1024 {
		return fmt.Errorf("cpu_percent %d out of range 0..%d", l.CPUPercent, 100*1024)
	}
	if l.CPUPercent > 0 && l.CPUPercent < 1 {
		return fmt.Errorf("cpu_percent %d below 1", l.CPUPercent)
	}
	return nil
}

// Tracking says how a session's processes are found.
type Tracking string

// Tracking modes.
const (
	// TrackCgroup: a cgroup v2 group /sys/fs/cgroup/vmgate/<id>.
	TrackCgroup Tracking = "cgroup"
	// TrackMarker: no cgroup: a sandboxed session's processes are found by
	// their uid, others by the VMGATE_SESSION=<id>.<secret> environment
	// marker found through /proc/*/environ (Enforced.Membership says which),
	// each run in its own process group.
	TrackMarker Tracking = "marker"
)

// SessionCreate is create's request.
type SessionCreate struct {
	ID     string `json:"id"`
	TTLS   int64  `json:"ttl_s,omitempty"`  // 0: no ttl
	IdleS  int64  `json:"idle_s,omitempty"` // 0: no idle limit
	Limits Limits `json:"limits"`
	// Sandbox confines the session's processes; nil runs them as root,
	// unconfined (tracked and limited only).
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}

// Session is a session's metadata as stored and listed.
type Session struct {
	ID         string   `json:"id"`
	Workdir    string   `json:"workdir"`
	Tracking   Tracking `json:"tracking"`
	CreatedMS  int64    `json:"created_ms"`
	LastUsedMS int64    `json:"last_used_ms"`
	TTLS       int64    `json:"ttl_s,omitempty"`
	IdleS      int64    `json:"idle_s,omitempty"`
	Limits     Limits   `json:"limits"`
	// Sandbox is what was asked for (normalized); nil when nothing was.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// Enforced is what holds on this guest.
	Enforced Enforced `json:"enforced"`
	// Processes is the member count when listed (not stored).
	Processes int `json:"processes"`
	// Expired is set when listed and past ttl or idle (not stored).
	Expired bool `json:"expired,omitempty"`
}

// ExpiredAt reports whether s is past its ttl or idle time at nowMS.
func (s Session) ExpiredAt(nowMS int64) bool {
	if s.TTLS > 0 && nowMS >= s.CreatedMS+s.TTLS*1000 {
		return true
	}
	if s.IdleS > 0 && nowMS >= s.LastUsedMS+s.IdleS*1000 {
		return true
	}
	return false
}

// DestroyResult is what destroy returns.
type DestroyResult struct {
	ID string `json:"id"`
	// Existed is false when there was nothing to destroy (destroy is idempotent).
	Existed bool `json:"existed"`
	// Killed counts the processes signalled.
	Killed int   `json:"killed"`
	Rounds int   `json:"rounds"`
	TookMS int64 `json:"took_ms"`
	// TrashUntilMS is set when the workdir went to the trash (destroy
	// --trash-s): until then, restore brings its files back.
	TrashUntilMS int64 `json:"trash_until_ms,omitempty"`
}

// MaxTrashS bounds destroy's --trash-s (a day: the server keeps a
// destroyed session's record that long, and checks it before a restore).
const MaxTrashS = 24 * 60 * 60

// RestoreResult is what restore returns: the top-level entries of session
// From's trash, now in session ID's workdir.
type RestoreResult struct {
	ID      string   `json:"id"`
	From    string   `json:"from"`
	Workdir string   `json:"workdir"`
	Entries []string `json:"entries"`
	// KeptOwner counts the entries that kept their owner instead of
	// becoming ID's: device nodes, and files with other hard links that
	// session From did not own (giving them away would give every name).
	KeptOwner int `json:"kept_owner,omitempty"`
}

// ReapResult lists the sessions reap destroyed.
type ReapResult struct {
	Destroyed []DestroyResult `json:"destroyed"`
}

// Version is what `vmgate-guest version --json` prints.
type Version struct {
	Version string `json:"version"`
	GOOS    string `json:"goos"`
	GOARCH  string `json:"goarch"`
}

// ID lengths of a session id.
const (
	MinIDLen = 16
	MaxIDLen = 64
)

// ErrInvalidID is returned (wrapped) for a session id that is not [a-z0-9]{16,64}.
var ErrInvalidID = errors.New("invalid session id")

// ValidateSessionID accepts only [a-z0-9]{16,64}: no path separators, dots,
// dashes, glob characters or non-ASCII look-alikes can reach a path.
func ValidateSessionID(id string) error {
	if len(id) < MinIDLen || len(id) > MaxIDLen {
		return fmt.Errorf("%w: length %d not in %d..%d", ErrInvalidID, len(id), MinIDLen, MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("%w: byte %d (%q) is not [a-z0-9]", ErrInvalidID, i, c)
		}
	}
	return nil
}

// Signals kill accepts, by name, with their Linux numbers.
var signals = map[string]int{
	"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "QUIT": 3,
	"USR1": 10, "USR2": 12, "STOP": 19, "CONT": 18,
}

// ErrInvalidSignal is returned (wrapped) for a signal outside the allowed set.
var ErrInvalidSignal = errors.New("invalid signal")

// ParseSignal accepts TERM KILL INT HUP QUIT USR1 USR2 STOP CONT, with or
// without a SIG prefix, in any case; "" means TERM. It returns the canonical
// name and the Linux signal number. Numbers are not accepted.
func ParseSignal(s string) (string, int, error) {
	if s == "" {
		return "TERM", 15, nil
	}
	ascii := len(s) <= 7
	for i := 0; i < len(s) && ascii; i++ {
		c := s[i]
		ascii = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
	}
	if ascii {
		name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
		if n, ok := signals[name]; ok {
			return name, n, nil
		}
	}
	return "", 0, fmt.Errorf("%w: %q (want one of TERM KILL INT HUP QUIT USR1 USR2 STOP CONT)", ErrInvalidSignal, s)
}
