package qga

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Output caps.
const (
	// AgentOutputLimit is what qemu-ga itself keeps of each output stream
	// (it sets out-truncated/err-truncated beyond it).
	AgentOutputLimit = 16 << 20
	// DefaultMaxOutputBytes caps each stream when a request sets no cap.
	DefaultMaxOutputBytes = 1 << 20
)

// cwdScript runs "$@" in directory "$1", which it enters following no
// symlink: cd -P goes to the physical directory, and the command runs only
// when that is "$1" itself. So a path through a symlink (or a magic link
// such as /proc/1/root), swapped in after the server checked the path, is
// refused with status 126 and a message on stderr. The directory and argv
// are passed as arguments, never interpolated into the script.
const cwdScript = `cd -P "$1" || exit; if [ "$(pwd -P)" != "$1" ]; then ` +
	`printf 'vmgate: cwd %s leads through a symlink (to %s); the command did not run\n' "$1" "$(pwd -P)" >&2; exit 126; fi; ` +
	`shift; exec "$@"`

// ExecRequest is a command to run in the guest.
type ExecRequest struct {
	// Path is the program; a name without a slash is looked up in the agent's PATH.
	Path string
	// Args are the arguments after argv[0]. No shell is involved.
	Args []string
	// Env holds KEY=VALUE entries added to the agent's environment. qemu-ga's
	// own env argument replaces the whole environment, so a non-empty Env runs
	// the command through env(1): env KEY=VALUE... Path Args...; keys must be
	// portable names ([A-Za-z_][A-Za-z0-9_]*) and Path must not contain '='.
	Env []string
	// Stdin is written to the command's standard input, which is then closed.
	Stdin []byte
	// Cwd is the working directory; it must be absolute. guest-exec has no
	// cwd, so a non-empty Cwd runs the command through /bin/sh -c cwdScript
	// sh Cwd Path Args... (everything passed as argv, nothing interpolated);
	// a missing directory makes the shell exit with status 2 and a message
	// on stderr, a Cwd that leads through a symlink with status 126.
	Cwd string
	// Timeout, when positive, bounds the run time in Exec: when it fires the
	// process and its whole tree are killed (SIGKILL through a second
	// guest-exec, see KillTree, since the agent has no kill command) and the
	// result has TimedOut with the output so far. ExecStart does not enforce it.
	Timeout time.Duration
	// MaxOutputBytes caps each of stdout and stderr. 0 means
	// DefaultMaxOutputBytes; values above AgentOutputLimit are clamped to it.
	MaxOutputBytes int64
}

// ExecStatus is the state of a started command.
type ExecStatus struct {
	PID    int64
	Exited bool
	// ExitCode is the exit status when Exited and Signal is 0; -1 when a signal ended the command.
	ExitCode int
	// Signal is the number of the signal that ended the command, 0 if none.
	Signal                           int
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	// TimedOut: the request's Timeout fired and the command was killed.
	TimedOut bool
}

// validate checks r and returns the guest-exec arguments to send.
func (r ExecRequest) validate() (execArgs, error) {
	if r.Path == "" {
		return execArgs{}, fmt.Errorf("%w: empty path", ErrInvalidArgument)
	}
	if err := checkString("path", r.Path); err != nil {
		return execArgs{}, err
	}
	for i, a := range r.Args {
		if err := checkString(fmt.Sprintf("args[%d]", i), a); err != nil {
			return execArgs{}, err
		}
	}
	for i, e := range r.Env {
		if err := checkString(fmt.Sprintf("env[%d]", i), e); err != nil {
			return execArgs{}, err
		}
		key, _, ok := cutEnv(e)
		if !ok || !portableName(key) {
			return execArgs{}, fmt.Errorf("%w: env[%d] %q is not KEY=VALUE with a portable name", ErrInvalidArgument, i, e)
		}
	}
	if len(r.Env) > 0 && containsByte(r.Path, '=') {
		return execArgs{}, fmt.Errorf("%w: path %q contains '=' (not allowed with env)", ErrInvalidArgument, r.Path)
	}
	if r.Cwd != "" {
		if err := checkString("cwd", r.Cwd); err != nil {
			return execArgs{}, err
		}
		if r.Cwd[0] != '/' {
			return execArgs{}, fmt.Errorf("%w: cwd %q is not absolute", ErrInvalidArgument, r.Cwd)
		}
	}
	if r.Timeout < 0 {
		return execArgs{}, fmt.Errorf("%w: negative timeout %v", ErrInvalidArgument, r.Timeout)
	}
	if r.MaxOutputBytes < 0 {
		return execArgs{}, fmt.Errorf("%w: negative max output bytes %d", ErrInvalidArgument, r.MaxOutputBytes)
	}

	argv := append([]string{r.Path}, r.Args...)
	if len(r.Env) > 0 {
		argv = append(append([]string{"env"}, r.Env...), argv...)
	}
	if r.Cwd != "" {
		argv = append([]string{"/bin/sh", "-c", cwdScript, "sh", r.Cwd}, argv...)
	}
	a := execArgs{Path: argv[0], Arg: argv[1:], CaptureOutput: true}
	if len(r.Stdin) > 0 {
		a.InputData = base64.StdEncoding.EncodeToString(r.Stdin)
	}
	return a, nil
}

func cutEnv(e string) (key, value string, ok bool) {
	for i := 0; i < len(e); i++ {
		if e[i] == '=' {
			return e[:i], e[i+1:], true
		}
	}
	return "", "", false
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

func portableName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// outputCap is the effective per-stream cap for a requested one.
func outputCap(max int64) int64 {
	if max <= 0 {
		return DefaultMaxOutputBytes
	}
	return min(max, AgentOutputLimit)
}

type execArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	Env           []string `json:"env,omitempty"`
	InputData     string   `json:"input-data,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

// ExecStart starts req (guest-exec with captured output) and returns the
// guest pid to poll with ExecStatus. A disabled guest-exec is a *DisabledError.
func (a Agent) ExecStart(ctx context.Context, req ExecRequest) (int64, error) {
	args, err := req.validate()
	if err != nil {
		return 0, fmt.Errorf("qga: guest-exec: %w", err)
	}
	var reply struct {
		PID *int64 `json:"pid"`
	}
	if err := a.Caller.Call(ctx, "guest-exec", args, &reply); err != nil {
		return 0, err
	}
	if reply.PID == nil {
		return 0, fmt.Errorf("qga: guest-exec: %w: reply has no pid", ErrProtocol)
	}
	return *reply.PID, nil
}

// ExecStatus polls pid (guest-exec-status). Each output stream is cut to
// maxOutputBytes (0: DefaultMaxOutputBytes) with its truncated flag set.
// Once a status with Exited was returned the agent forgets pid: a later
// poll fails with ErrUnknownExec.
func (a Agent) ExecStatus(ctx context.Context, pid int64, maxOutputBytes int64) (ExecStatus, error) {
	if pid <= 0 {
		return ExecStatus{}, fmt.Errorf("qga: guest-exec-status: %w: pid %d", ErrInvalidArgument, pid)
	}
	if maxOutputBytes < 0 {
		return ExecStatus{}, fmt.Errorf("qga: guest-exec-status: %w: negative max output bytes %d", ErrInvalidArgument, maxOutputBytes)
	}
	var r struct {
		Exited       bool   `json:"exited"`
		ExitCode     *int   `json:"exitcode"`
		Signal       *int   `json:"signal"`
		OutData      string `json:"out-data"`
		ErrData      string `json:"err-data"`
		OutTruncated bool   `json:"out-truncated"`
		ErrTruncated bool   `json:"err-truncated"`
	}
	args := struct {
		PID int64 `json:"pid"`
	}{pid}
	if err := a.Caller.Call(ctx, "guest-exec-status", args, &r); err != nil {
		var e *Error
		if errors.As(err, &e) && isUnknownPID(e) {
			return ExecStatus{}, fmt.Errorf("qga: guest-exec-status: pid %d: %w", pid, ErrUnknownExec)
		}
		return ExecStatus{}, err
	}
	st := ExecStatus{PID: pid, Exited: r.Exited, StdoutTruncated: r.OutTruncated, StderrTruncated: r.ErrTruncated}
	if r.Signal != nil && *r.Signal != 0 {
		st.Signal, st.ExitCode = *r.Signal, -1
	} else if r.ExitCode != nil {
		st.ExitCode = *r.ExitCode
	} else if r.Exited {
		return ExecStatus{}, fmt.Errorf("qga: guest-exec-status: %w: exited without exit code or signal", ErrProtocol)
	}
	var err error
	if st.Stdout, err = base64Decode("guest-exec-status", "out-data", r.OutData); err != nil {
		return ExecStatus{}, err
	}
	if st.Stderr, err = base64Decode("guest-exec-status", "err-data", r.ErrData); err != nil {
		return ExecStatus{}, err
	}
	limit := outputCap(maxOutputBytes)
	if int64(len(st.Stdout)) > limit {
		st.Stdout, st.StdoutTruncated = st.Stdout[:limit], true
	}
	if int64(len(st.Stderr)) > limit {
		st.Stderr, st.StderrTruncated = st.Stderr[:limit], true
	}
	return st, nil
}

// Poll pacing of Exec: a settling pause of settleShare of guest-exec's own
// round trip (at most settleCeiling) before the first poll, back to back
// until backToBack after the command started, then waits from pollFirst,
// each a quarter longer than the one before, up to pollCeiling (as
// hypervisor.Backoff).
const (
	settleShare   = 0.4
	settleCeiling = 20 * time.Millisecond
	backToBack    = 30 * time.Millisecond
	pollFirst     = time.Millisecond
	pollCeiling   = 200 * time.Millisecond
)

// pacer paces the guest-exec-status polls of one command. For the first
// backToBack after the command started it polls back to back, so a short
// command (most are: ls, cat, a build step's /bin/true) is seen finished
// within one agent round trip of finishing, as a caller polling in a tight
// loop would see it; after that the waits grow from pollFirst by a quarter
// each up to pollCeiling, so a long command costs few polls and little
// guest CPU and is seen finished at most about 30% of its run time late
// (doubling made that up to all of it: a helper run that ended at 100 ms
// was seen at 157 ms). Before, the first waits were 1, 2, 4, 8 ms from the
// first poll: a command that ended at 9 ms was seen at 15 ms.
//
// The settling pause: the guest agent answers every poll on the guest's own
// CPUs, and right after guest-exec returns the command is still being
// loaded. Polls then take the CPU it needs: on the one-CPU TCG lab guest,
// back-to-back polling from the start made /bin/true take 15.3 ms and 4.4
// polls, a first poll after 0.4 of guest-exec's round trip 11.2 ms and 1.2
// (ls -l /etc 0.91 of the time, sleep 0.02 0.96, a shell pipeline 1.02;
// medians of 8 rounds of 15, raw agent client). The pause scales with the
// guest: where guest-exec answers in 1 ms it is 0.4 ms.
type pacer struct {
	start time.Time
	wait  time.Duration
}

func newPacer() pacer { return pacer{start: time.Now(), wait: pollFirst} }

// settle is the pause before the first poll of a command whose guest-exec
// took spawn, cut to end no later than deadline (zero: none), so the first
// poll still comes before a timeout does.
func settle(spawn time.Duration, deadline time.Time) time.Duration {
	d := min(time.Duration(settleShare*float64(spawn)), settleCeiling)
	if !deadline.IsZero() {
		d = min(d, time.Until(deadline))
	}
	return max(d, 0)
}

// next returns how long to wait before the next poll.
func (p *pacer) next() time.Duration {
	if time.Since(p.start) < backToBack {
		return 0
	}
	d := p.wait
	p.wait = min(p.wait+p.wait/4, pollCeiling)
	return d
}

// abandonKillTimeout bounds the kill of a command whose caller's context ended.
const abandonKillTimeout = 5 * time.Second

// Starter is what running a command needs of an agent: start it, poll it.
// Agent and *Client implement it; so can a driver that relays guest-exec
// its own way (a hypervisor's REST endpoints for the guest agent).
type Starter interface {
	ExecStart(ctx context.Context, req ExecRequest) (int64, error)
	ExecStatus(ctx context.Context, pid int64, maxOutputBytes int64) (ExecStatus, error)
}

// Execer is a Starter that can also kill a command's process tree (with
// KillTree over its own Starter, or its own way).
type Execer interface {
	Starter
	KillTree(ctx context.Context, pid int64) error
}

// Exec runs req to completion: see Agent.Exec.
func (a Agent) Exec(ctx context.Context, req ExecRequest) (ExecStatus, error) {
	return Exec(ctx, a, req)
}

// Exec runs req to completion through e: it starts it, polls adaptively
// (after a settling pause of 0.4 of guest-exec's round trip, back to back
// until 30 ms, then from 1 ms growing by a quarter to 200 ms; see pacer)
// and, when req.Timeout fires, kills its tree and returns the final status
// with TimedOut set. When ctx ends first the command's tree is killed too,
// and the error wraps ErrTimeout (or context.Canceled) and names the pid.
func Exec(ctx context.Context, e Execer, req ExecRequest) (ExecStatus, error) {
	started := time.Now()
	pid, err := e.ExecStart(ctx, req)
	if err != nil {
		return ExecStatus{}, err
	}
	spawn := time.Since(started)
	var deadline time.Time
	if req.Timeout > 0 {
		deadline = time.Now().Add(req.Timeout)
	}
	pace := newPacer()
	if err := sleep(ctx, settle(spawn, deadline)); err != nil {
		return abandon(ctx, e, pid, ExecStatus{PID: pid}, err)
	}
	for {
		st, err := e.ExecStatus(ctx, pid, req.MaxOutputBytes)
		if err != nil {
			return ExecStatus{PID: pid}, fmt.Errorf("qga: exec: pid %d: %w", pid, err)
		}
		if st.Exited {
			return st, nil
		}
		d := pace.next()
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return killAndCollect(ctx, e, pid, req.MaxOutputBytes)
			}
			d = min(d, left)
		}
		if err := sleep(ctx, d); err != nil {
			return abandon(ctx, e, pid, st, err)
		}
	}
}

// abandon kills pid's tree because the caller gave up (err, from ctx): a
// command is not left running behind its back (wait: false is how a caller
// keeps a command alive). The kill gets a short context of its own, since
// ctx is done. st is the last status seen.
func abandon(ctx context.Context, e Execer, pid int64, st ExecStatus, err error) (ExecStatus, error) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonKillTimeout)
	kerr := e.KillTree(kctx, pid)
	cancel()
	if kerr != nil {
		return st, fmt.Errorf("qga: exec: pid %d abandoned and could not be killed (%v): %w", pid, kerr, err)
	}
	return st, fmt.Errorf("qga: exec: pid %d killed when the call ended: %w", pid, err)
}

// killAndCollect kills pid after its timeout and returns its final status.
func killAndCollect(ctx context.Context, e Execer, pid int64, maxOutputBytes int64) (ExecStatus, error) {
	if err := e.KillTree(ctx, pid); err != nil {
		return ExecStatus{PID: pid}, fmt.Errorf("qga: exec: timeout: %w", err)
	}
	st, err := waitExited(ctx, e, pid, maxOutputBytes)
	if err != nil {
		return ExecStatus{PID: pid}, fmt.Errorf("qga: exec: timeout: pid %d: %w", pid, err)
	}
	st.TimedOut = true
	return st, nil
}

// Kill sends SIGKILL to pid in the guest through a guest-exec of
// `kill -KILL <pid>` (the agent has no kill command) and collects the kill
// command's own status. Only pid itself is signalled, not its children.
func (a Agent) Kill(ctx context.Context, pid int64) error {
	if pid < 2 {
		return fmt.Errorf("qga: kill: %w: pid %d", ErrInvalidArgument, pid)
	}
	kpid, err := a.ExecStart(ctx, ExecRequest{Path: "kill", Args: []string{"-KILL", strconv.FormatInt(pid, 10)}})
	if err != nil {
		return fmt.Errorf("qga: kill %d: %w", pid, err)
	}
	if _, err := waitExited(ctx, a, kpid, 4096); err != nil {
		return fmt.Errorf("qga: kill %d: %w", pid, err)
	}
	// A failed kill means pid had exited already: not an error here.
	return nil
}

// KillTreeScript kills the process tree rooted at "$1" with SIGKILL: it
// stops the root so that it cannot fork any more, then repeatedly scans
// /proc for processes whose parent is already in the set (stopping each one
// it adds) until the set stops growing, and also adds every process that
// holds the root's stdout or stderr pipe (a child that double-forked away
// from the tree but would keep the agent waiting for end of output). Then it
// kills them all. The pid is passed as an argument, never interpolated.
// It uses only POSIX sh, test and kill, so it runs on busybox and full
// distros, and a scan forks nothing (read and test -ef are built in): on a
// busy guest, a fork per process made the kill itself take many seconds.
const KillTreeScript = `root=$1
case "$root" in ''|*[!0-9]*) exit 2;; esac
kill -STOP "$root" 2>/dev/null
out=; err=
case $(readlink "/proc/$root/fd/1" 2>/dev/null) in pipe:*) out=/proc/$root/fd/1;; esac
case $(readlink "/proc/$root/fd/2" 2>/dev/null) in pipe:*) err=/proc/$root/fd/2;; esac
all=" $root "
grown=1
while [ "$grown" = 1 ]; do
  grown=0
  for s in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$s" || continue
    pid=${line%% *}
    case "$all" in *" $pid "*) continue;; esac
    [ "$pid" = "$$" ] && continue
    set -- ${line##*) }
    add=0
    case "$all" in *" $2 "*) add=1;; esac
    if [ "$add" = 0 ] && { [ -n "$out" ] || [ -n "$err" ]; }; then
      for fd in /proc/$pid/fd/1 /proc/$pid/fd/2; do
        if { [ -n "$out" ] && [ "$fd" -ef "$out" ]; } || { [ -n "$err" ] && [ "$fd" -ef "$err" ]; }; then add=1; fi
      done
    fi
    if [ "$add" = 1 ]; then
      kill -STOP "$pid" 2>/dev/null
      all="$all$pid "
      grown=1
    fi
  done
done
kill -KILL $all 2>/dev/null
exit 0`

// KillTree sends SIGKILL to pid and every descendant of it in the guest, and
// to any process still holding its output pipes, through a guest-exec of
// /bin/sh running KillTreeScript (the agent has no kill command). Processes
// are stopped before they are collected, so a fork loop cannot outrun it.
// Like Kill, a pid that has already exited is not an error.
func (a Agent) KillTree(ctx context.Context, pid int64) error { return KillTree(ctx, a, pid) }

// KillTree kills pid's process tree (see Agent.KillTree) by starting
// KillTreeScript through s and waiting for it.
func KillTree(ctx context.Context, s Starter, pid int64) error {
	if pid < 2 {
		return fmt.Errorf("qga: kill tree: %w: pid %d", ErrInvalidArgument, pid)
	}
	kpid, err := s.ExecStart(ctx, ExecRequest{Path: "/bin/sh", Args: []string{"-c", KillTreeScript, "sh", strconv.FormatInt(pid, 10)}})
	if err != nil {
		return fmt.Errorf("qga: kill tree %d: %w", pid, err)
	}
	if _, err := waitExited(ctx, s, kpid, 4096); err != nil {
		return fmt.Errorf("qga: kill tree %d: %w", pid, err)
	}
	return nil
}

// waitExited polls pid until it has exited.
func waitExited(ctx context.Context, s Starter, pid int64, maxOutputBytes int64) (ExecStatus, error) {
	pace := newPacer()
	for {
		st, err := s.ExecStatus(ctx, pid, maxOutputBytes)
		if err != nil || st.Exited {
			return st, err
		}
		if err := sleep(ctx, pace.next()); err != nil {
			return st, err
		}
	}
}
