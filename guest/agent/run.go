//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// defaultPath is the PATH of a run when the agent's own environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// waitDelay is how long a run waits for its output pipes to close after its
// process exited (background members of a session may hold them open).
const waitDelay = 250 * time.Millisecond

// killTimeout bounds a run's tree kill after its timeout fired.
const killTimeout = 5 * time.Second

// validateRun checks a run request without side effects.
func validateRun(req wire.RunRequest) error {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return invalidf("run: exactly one of argv and shell must be set")
	}
	if len(req.Argv) > 0 && req.Argv[0] == "" {
		return invalidf("run: argv[0] is empty")
	}
	for i, s := range req.Argv {
		if strings.IndexByte(s, 0) >= 0 {
			return invalidf("run: argv[%d] contains NUL", i)
		}
	}
	if strings.IndexByte(req.Shell, 0) >= 0 {
		return invalidf("run: shell contains NUL")
	}
	if req.Cwd != "" {
		if err := checkFilePath("run: cwd", req.Cwd); err != nil {
			return err
		}
	}
	for k, v := range req.Env {
		if !validEnvKey(k) {
			return invalidf("run: env key %q is not [A-Za-z_][A-Za-z0-9_]*", k)
		}
		if strings.HasPrefix(k, "VMGATE_") {
			return invalidf("run: env key %s is reserved (VMGATE_* variables are set by vmgate)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalidf("run: env %s contains NUL", k)
		}
	}
	if req.Session != "" {
		if err := wire.ValidateSessionID(req.Session); err != nil {
			return invalidf("run: %v", err)
		}
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > wire.MaxRunTimeoutMS {
		return invalidf("run: timeout_ms %d out of range 0..%d", req.TimeoutMS, wire.MaxRunTimeoutMS)
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > wire.MaxOutputBytesLimit {
		return invalidf("run: max_output_bytes %d out of range 0..%d", req.MaxOutputBytes, wire.MaxOutputBytesLimit)
	}
	return nil
}

func validEnvKey(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		alpha := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !alpha && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// capped keeps the first max bytes written to it. mu guards buf and truncated.
type capped struct {
	mu        sync.Mutex
	buf       []byte
	max       int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(p), c.max-len(c.buf))
	c.buf = append(c.buf, p[:n]...)
	if n < len(p) {
		c.truncated = true
	}
	return len(p), nil
}

func (c *capped) result() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf), c.truncated
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run runs req in a new process group (and, in a cgroup-tracked session, a
// run cgroup inside the session's group), with the session's marker in its
// environment and, in a sandboxed session, confined from its first
// instruction (see startConfined). When the timeout fires (or ctx ends) the
// whole tree is killed: SIGTERM, then after Config.Grace SIGKILL to the
// process group, the run's cgroup, and every process carrying the run's
// marker or descending from it, in rounds until none is left; the result
// has TimedOut and the output so far.
func (a *Agent) Run(ctx context.Context, req wire.RunRequest) (wire.RunResult, error) {
	if req.Sandbox != nil {
		return a.runOneShot(ctx, req)
	}
	return a.run(ctx, req, nil)
}

// run is Run of req, in own when set (startRun).
func (a *Agent) run(ctx context.Context, req wire.RunRequest, own *meta) (wire.RunResult, error) {
	maxOut := outputCap(req)
	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	p, err := a.startRun(req, own, stdout, stderr)
	if err != nil {
		return wire.RunResult{}, err
	}
	defer p.r.close()
	res, err := a.wait(ctx, p.cmd, p.r, p.timeout)
	if err != nil {
		return res, err
	}
	res.Stdout, res.StdoutTruncated = stdout.result()
	res.Stderr, res.StderrTruncated = stderr.result()
	if res.ExitCode != 0 {
		res.WriteBlocked = p.r.writeBlocked
	}
	return res, nil
}

// runOneShot runs req confined by req.Sandbox in a session of its own
// (oneShotSession), destroyed after it with every process the command
// left: in this call by a process per command, right after the reply by
// the resident helper.
func (a *Agent) runOneShot(ctx context.Context, req wire.RunRequest) (wire.RunResult, error) {
	if req.Session != "" {
		return wire.RunResult{}, invalidf("run: sandbox and session are exclusive (a session has its own sandbox)")
	}
	if err := validateRun(req); err != nil {
		return wire.RunResult{}, err
	}
	req, own, end, err := a.oneShotSession(ctx, req)
	if err != nil {
		return wire.RunResult{}, err
	}
	defer end()
	return a.run(ctx, req, own)
}

// outputCap is the per-stream output cap of req.
func outputCap(req wire.RunRequest) int {
	if req.MaxOutputBytes == 0 {
		return wire.DefaultMaxOutputBytes
	}
	return int(req.MaxOutputBytes)
}

// running is a run whose process has started; the caller waits for it
// (Agent.wait) and then closes r.
type running struct {
	r       *runSetup
	cmd     *exec.Cmd
	timeout time.Duration
}

// startRun validates req and starts its process with stdout and stderr
// as its output, joining its session (if any) for the start. own, when
// set, is the session of a one-shot run, which this run alone holds
// (oneShotSession): it is joined as it is, without the lock.
func (a *Agent) startRun(req wire.RunRequest, own *meta, stdout, stderr io.Writer) (running, error) {
	if err := validateRun(req); err != nil {
		return running{}, err
	}
	if err := checkCwd(req.Cwd); err != nil {
		return running{}, err
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout == 0 {
		timeout = wire.DefaultRunTimeoutMS * time.Millisecond
	}
	r := &runSetup{runID: randomHex(12), cwd: req.Cwd, argv: req.Argv,
		attr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	if req.Shell != "" {
		r.argv = []string{"/bin/sh", "-c", req.Shell}
	}
	r.env = append(childEnv(os.Environ(), req.Env), RunEnv+"="+r.runID)
	if r.cwd == "" {
		r.cwd = "/"
	}
	release := func() {}
	switch {
	case own != nil:
		if err := a.joinMeta(r, req, *own); err != nil {
			r.close()
			return running{}, err
		}
	case req.Session != "":
		var err error
		if release, err = a.joinSession(r, req); err != nil {
			r.close()
			return running{}, err
		}
	}
	r.startedAt = time.Now()
	cmd, err := r.start(req.Stdin, stdout, stderr)
	release()
	if err != nil {
		r.close()
		return running{}, err
	}
	a.childStarted(cmd.Process.Pid)
	return running{r: r, cmd: cmd, timeout: timeout}, nil
}

// checkCwd refuses a cwd that is no directory or that is reached through a
// symlink (a magic link such as /proc/1/root included), as the file tools
// refuse such a path (files.go); the host asked for the real directory
// when its policy follows symlinks. The directory is entered by its path
// afterwards: a symlink swapped in between by a session's own process
// gives that process nothing (the sandbox decides by what a file is, not
// by the name it was reached by), and a root process owns the guest anyway.
func checkCwd(cwd string) error {
	if cwd == "" {
		return nil
	}
	fd, err := openNoFollow("run: cwd", cwd, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// runSetup is one run's process before it starts.
type runSetup struct {
	runID     string
	argv      []string
	env       []string
	cwd       string
	attr      *syscall.SysProcAttr
	runCgroup string   // the run's cgroup, "" without one
	cgroupFD  *os.File // open on runCgroup for CLONE_INTO_CGROUP
	sandboxed bool     // argv starts with the sandbox shim
	// writeBlocked is the session's Enforced.WriteBlocked, for a failed
	// command's result.
	writeBlocked []wire.BlockedPath
	// confine, when set, is applied to a thread of the run's own, which
	// starts the process (startConfined), or is the confinement of the
	// session's kept thread in threads (thread.go), under threadKey, for
	// session; release ends the run's thread or gives the kept one back.
	confine   *confinement
	threads   *threadCache
	threadKey string
	session   string
	release   func()
	// onThread: start runs on the run's own confined thread, which forks
	// the process itself (see forkOnStableThread for the others).
	onThread bool
	// startedAt is when startRun started the process: a run's duration
	// counts from it, not from its wait, which a job begins only after it
	// recorded the job.
	startedAt time.Time
}

func (r *runSetup) close() {
	if r.cgroupFD != nil {
		r.cgroupFD.Close()
	}
	if r.release != nil {
		r.release()
	}
}

// joinSession points r at the session's workdir, marker, cgroup and
// confinement, under the lock. The caller calls release once the process
// has started (so a destroy cannot run between the check and the start):
// it records the use (the idle limit's clock; a write and an fsync of the
// metadata, which then overlap the command's run instead of delaying its
// start) and unlocks.
func (a *Agent) joinSession(r *runSetup, req wire.RunRequest) (release func(), err error) {
	unlock, err := a.lock()
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	m, err := a.readMeta(req.Session)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	if m.OneShot {
		return nil, notFoundf("run: session %s is a one-shot run's own: it takes no other command", m.ID)
	}
	if err := a.joinMeta(r, req, m); err != nil {
		return nil, err
	}
	return func() {
		if a.res != nil {
			unlock()
			a.res.touchLater(a, m.ID)
			return
		}
		if err := a.touchLocked(m); err != nil {
			a.cfg.Logger.Warn("run: recording last use", "session", m.ID, "err", err)
		}
		unlock()
	}, nil
}

// joinMeta points r at session m's workdir, marker, cgroup and
// confinement.
func (a *Agent) joinMeta(r *runSetup, req wire.RunRequest, m meta) error {
	if req.Cwd == "" {
		r.cwd = m.Workdir
	}
	r.env = append(r.env, SessionEnv+"="+m.marker())
	if m.Tracking == wire.TrackCgroup {
		dir, f, err := a.newRunCgroup(m.ID, r.runID)
		if err != nil {
			return fmt.Errorf("run: %w", err)
		}
		r.runCgroup, r.cgroupFD = dir, f
		r.attr.UseCgroupFD, r.attr.CgroupFD = true, int(f.Fd())
	}
	switch {
	case m.Sandbox != nil:
		r.writeBlocked = m.Enforced.WriteBlocked
		c := m.confinement()
		r.env = sandboxEnv(r.env, m, req.Env)
		if c.RlimitAS == 0 && c.RlimitNPROC == 0 {
			r.confineThread(c)
			if a.res != nil {
				r.threads, r.threadKey, r.session = a.res.threads, threadKey(m.Token, c), m.ID
			}
			break
		}
		// Rlimits are the whole process's: only a shim of the run's own
		// can set them before the command's first instruction.
		spec, err := json.Marshal(c)
		if err != nil {
			return fmt.Errorf("run: %w", err)
		}
		r.argv = append([]string{a.cfg.Self, SandboxCommand, string(spec), "--"}, r.argv...)
		r.sandboxed = true
	case m.Tracking != wire.TrackCgroup && (m.Limits.MemoryMB > 0 || m.Limits.Pids > 0):
		r.argv = append([]string{a.cfg.Self, shimCommand,
			"--as", strconv.FormatInt(m.Limits.MemoryMB<<20, 10),
			"--nproc", strconv.FormatInt(m.Limits.Pids, 10), "--"}, r.argv...)
	}
	return nil
}

// start starts the process. For a sandboxed run it waits for the shim's
// verdict on the status pipe: nothing before the pipe closes means the
// shim exec'd the command confined; a reason means it did not, and the
// run fails without the command having run.
func (r *runSetup) start(stdin []byte, stdout, stderr io.Writer) (*exec.Cmd, error) {
	if r.confine != nil && r.threads != nil {
		return r.startKept(stdin, stdout, stderr)
	}
	if r.confine != nil {
		return r.startConfined(stdin, stdout, stderr)
	}
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env, cmd.Dir, cmd.SysProcAttr = r.env, r.cwd, r.attr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = waitDelay
	var status *os.File
	if r.sandboxed {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("run: status pipe: %w", err)
		}
		defer pr.Close()
		cmd.ExtraFiles = []*os.File{pw}
		status = pr
		defer pw.Close()
	}
	var err error
	if r.onThread {
		err = cmd.Start()
	} else {
		err = forkOnStableThread(cmd.Start)
	}
	if len(cmd.ExtraFiles) > 0 {
		cmd.ExtraFiles[0].Close() // the child holds its own copy
	}
	if err != nil {
		if r.runCgroup != "" {
			_ = removeCgroupTree(r.runCgroup)
		}
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, notFoundf("run: %v", err)
		}
		return nil, fmt.Errorf("run: start: %w", err)
	}
	if status == nil {
		return cmd, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(status, 64<<10))
	if len(msg) == 0 {
		return cmd, nil
	}
	_ = cmd.Wait()
	if r.runCgroup != "" && len(cgroupPIDs(r.runCgroup)) == 0 {
		_ = removeCgroupTree(r.runCgroup)
	}
	var we wire.Error
	if err := json.Unmarshal(msg, &we); err != nil || we.Code == "" {
		return nil, fmt.Errorf("run: sandbox: unreadable status %q", msg)
	}
	we.Message = "run: " + we.Message
	return nil, &we
}

// confineThread makes r start confined as c says from a thread of its own
// (startConfined); the uid and gid change in the child, after the fork
// (Go's SysProcAttr.Credential: groups cleared, then gid, then uid), so
// the fork itself runs as root and can place the child in its cgroup.
func (r *runSetup) confineThread(c confinement) {
	r.confine = &c
	if c.UID >= 0 {
		r.attr.Credential = &syscall.Credential{Uid: uint32(c.UID), Gid: uint32(c.GID)}
	}
}

// startConfined starts the run from a new thread that carries r.confine
// (confinement.applyThread: Landlock, network and mount namespaces,
// no_new_privs, capabilities), which the process inherits at the fork:
// the command is confined from its first instruction with no shim of its
// own, which saved a second start of this program per run. The thread is
// never given back to the runtime (its goroutine ends locked, so it
// exits); it waits for r.release, as it is the process's parent for
// PR_SET_PDEATHSIG, which fires when the thread that forked ends.
func (r *runSetup) startConfined(stdin []byte, stdout, stderr io.Writer) (*exec.Cmd, error) {
	type started struct {
		cmd *exec.Cmd
		err error
	}
	c := r.confine
	r.confine = nil // start below runs the plain road, on the confined thread
	r.onThread = true
	if c.PrivateTmp {
		c.cwd, r.cwd = r.cwd, "" // entered by the thread, once its mounts are made
	}
	release, done := make(chan struct{}), make(chan started, 1)
	r.release = func() { close(release) }
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := c.applyThread(); err != nil {
			done <- started{err: fmt.Errorf("run: sandbox: %w", err)}
			return
		}
		cmd, err := r.start(stdin, stdout, stderr)
		done <- started{cmd, err}
		if err == nil {
			<-release
		}
	}()
	s := <-done
	if s.err != nil && r.runCgroup != "" {
		_ = removeCgroupTree(r.runCgroup)
	}
	return s.cmd, s.err
}

// startKept starts the run from its session's kept confined thread
// (thread.go), made now if the session has none that matches; the run
// holds it until its process is waited for (close).
func (r *runSetup) startKept(stdin []byte, stdout, stderr io.Writer) (*exec.Cmd, error) {
	c := *r.confine
	r.confine = nil // the thread starts the plain road
	t, err := r.threads.get(r.session, r.threadKey, c)
	if err == nil {
		var cmd *exec.Cmd
		if cmd, err = t.start(r, stdin, stdout, stderr); err == nil {
			r.release = func() { r.threads.release(t) }
			return cmd, nil
		}
		r.threads.release(t)
	} else {
		err = fmt.Errorf("run: sandbox: %w", err)
	}
	if r.runCgroup != "" {
		_ = removeCgroupTree(r.runCgroup)
	}
	return nil, err
}

// wait waits for cmd until it exits or timeout (or ctx) ends it, and kills
// the run's whole tree then. Stdout and Stderr are left to the caller.
func (a *Agent) wait(ctx context.Context, cmd *exec.Cmd, r *runSetup, timeout time.Duration) (wire.RunResult, error) {
	start := r.startedAt
	if start.IsZero() {
		start = time.Now()
	}
	pid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	res := wire.RunResult{PID: pid}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timer.C:
		res.TimedOut = true
	case <-ctx.Done():
		res.TimedOut = true
	}
	if res.TimedOut {
		t := tree{cgroup: r.runCgroup, pgid: pid, root: pid, markerKey: RunEnv, markerVal: r.runID}
		killed, _, kerr := a.killUntilGone(context.WithoutCancel(ctx), t, a.cfg.Grace, killTimeout)
		res.Killed = killed
		waitErr = <-done
		if kerr != nil {
			a.cfg.Logger.Error("run: tree kill", "pid", pid, "err", kerr)
			return res, fmt.Errorf("run: timeout: %w", kerr)
		}
	}
	res.DurationMS = time.Since(start).Milliseconds()
	if ps := cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal, res.ExitCode = int(ws.Signal()), -1
		} else {
			res.ExitCode = ps.ExitCode()
		}
	} else if waitErr != nil {
		return res, fmt.Errorf("run: wait: %w", waitErr)
	}
	// A run cgroup that emptied is removed; one with background members stays
	// until the session is destroyed. The resident helper does it after
	// the reply.
	if cg := r.runCgroup; cg != "" {
		tidy := func() {
			if len(cgroupPIDs(cg)) == 0 {
				_ = removeCgroupTree(cg)
			}
		}
		if a.res != nil {
			go tidy()
		} else {
			tidy()
		}
	}
	return res, nil
}

// childEnv is base without vmgate's markers, with PATH defaulted, plus extra
// (sorted by key so the result is deterministic).
func childEnv(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra)+3)
	hasPath := false
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if k == SessionEnv || k == RunEnv {
			continue
		}
		if _, over := extra[k]; over {
			continue
		}
		hasPath = hasPath || k == "PATH"
		out = append(out, kv)
	}
	if _, ok := extra["PATH"]; !hasPath && !ok {
		out = append(out, "PATH="+defaultPath)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+extra[k])
	}
	return out
}
