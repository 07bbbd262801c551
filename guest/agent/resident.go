//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/guest/mux"
)

// The resident helper: `vmgate-guest serve` stays running as root, outside
// every session, and serves every command of the CLI (the same dispatch,
// the same JSON replies) on a virtio-serial port, PortName, and on a unix
// socket, <Root>/helper/helper.sock, with guest/mux's framing: the host
// needs no process started per command.
//
// What keeps it apart from the sessions it serves:
//   - it runs as root; a session's processes run as a uid of their own
//     (or root confined by Landlock and namespaces where the policy
//     allowed user root), so they cannot signal or trace it; it is also
//     not dumpable (PR_SET_DUMPABLE 0: no ptrace attach, no core, its
//     /proc files root's), and kill refuses vmgate-guest by name;
//   - its oom_score_adj is lowOOMScore (the kernel's OOM killer takes
//     commands first); a command gets 0 back at its start (childStarted);
//   - it moves itself into a cgroup of its own, helperCgroup under the
//     cgroup root (unless systemd started it in its own unit), so it
//     outlives a restart of the guest agent whose exec started it and is
//     in no session's group;
//   - the port's device node, and any /dev/virtio-ports node of it, are
//     made root's, 0600; a port admits one opener, and the helper holds it;
//   - the socket is 0600 in a 0700 directory of root's, and a connection
//     whose peer is not uid 0 (SO_PEERCRED) is closed unserved;
//   - its binary is root's, in a root-owned directory (GuestPath), and the
//     host checks its SHA-256 in every hello.
//
// # Concurrency
//
// The helper runs calls concurrently, one goroutine each. Session changes
// take the flock on <Root>/lock (Agent.lock: a new open file description
// per call), which serialises them across the helper's goroutines and any
// vmgate-guest process the host starts per command (the fallback), which
// may run at the same time: both sides see the same files under that lock,
// and nothing else is shared. Jobs live only in the helper (jobTable).
// Only one helper serves a guest: <Root>/serve.lock is held with a
// non-blocking flock for the helper's life, and a second `serve` answers
// that one already runs.

// Names of the resident helper.
const (
	// PortName is the virtio-serial port the helper serves.
	PortName = "org.vmgate.guest.0"
	// UnitName is the systemd unit `vmgate-guest install` writes.
	UnitName = "vmgate-guest.service"
	// helperCgroup is the helper's own cgroup under the cgroup root.
	helperCgroup = "vmgate-helper"
	// lowOOMScore is the helper's oom_score_adj.
	lowOOMScore = -900
	// serveLockName holds the one helper's flock (and its pid).
	serveLockName = "serve.lock"
)

// SocketPath is the helper's unix socket under root.
func SocketPath(root string) string { return filepath.Join(root, "helper", "helper.sock") }

// ErrAlreadyServing: another helper holds <Root>/serve.lock.
var ErrAlreadyServing = errors.New("a resident vmgate-guest already serves this guest")

// ErrNoPort: the guest has no virtio-serial port of that name.
var ErrNoPort = errors.New("no such virtio-serial port")

// resident is the state only the resident helper has.
type resident struct {
	jobs       *jobTable
	pool       *sessionPool // nil when ServeOptions.OneShotPool is negative
	threads    *threadCache // sandboxed sessions' confined threads (thread.go)
	ids        idsScan
	hello      wire.Hello // fixed at start; Jobs is filled per answer
	oomLowered bool

	// stepsMu guards steps: the time each named step of the helper's
	// session creates (and one-shot destroys) took, in all (hello's
	// steps_us: where a create's time goes on this guest).
	stepsMu sync.Mutex
	steps   map[string]int64

	// touchMu guards touched: when each session's last use was last
	// written (touchLater).
	touchMu sync.Mutex
	touched map[string]time.Time
}

// stepTook adds d to step name's total in the resident helper.
func (a *Agent) stepTook(name string, d time.Duration) {
	r := a.res
	if r == nil {
		return
	}
	r.stepsMu.Lock()
	defer r.stepsMu.Unlock()
	if r.steps == nil {
		r.steps = map[string]int64{}
	}
	r.steps[name] += d.Microseconds()
}

// touchEvery is how often the resident helper writes a session's last use
// (the idle limit counts in seconds).
const touchEvery = time.Second

// touchKept bounds touched: past it, entries older than touchEvery go.
const touchKept = 1024

// touchLater records session id's use off the run's path: at most once
// per touchEvery, in a goroutine of its own that takes the lock and reads
// the metadata again (a destroy meanwhile leaves nothing to write). A
// process per command writes it as the run starts instead (joinSession).
func (r *resident) touchLater(a *Agent, id string) {
	now := time.Now()
	r.touchMu.Lock()
	if r.touched == nil {
		r.touched = map[string]time.Time{}
	}
	if now.Sub(r.touched[id]) < touchEvery {
		r.touchMu.Unlock()
		return
	}
	if len(r.touched) >= touchKept {
		for k, t := range r.touched { // sessions long gone or idle
			if now.Sub(t) >= touchEvery {
				delete(r.touched, k)
			}
		}
	}
	r.touched[id] = now
	r.touchMu.Unlock()
	go func() {
		unlock, err := a.lock()
		if err != nil {
			a.cfg.Logger.Warn("run: recording last use", "session", id, "err", err)
			return
		}
		defer unlock()
		if m, err := a.readMeta(id); err == nil {
			if err := a.touchLocked(m); err != nil {
				a.cfg.Logger.Warn("run: recording last use", "session", id, "err", err)
			}
		}
	}()
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Port is the virtio-serial port's name; "" serves none.
	Port string
	// Socket is the unix socket's path; "" means SocketPath(Root).
	Socket string
	// Ready, when set, is called once the helper listens.
	Ready func(hello wire.Hello)
	// KeepProcess leaves the calling process's dumpable flag, OOM score
	// and cgroup as they are (tests that serve in the test binary).
	KeepProcess bool
	// Replace ends the helper that serves already (SIGTERM: it ends its
	// jobs; SIGKILL after replaceWait) and serves in its place: how the
	// host moves a guest to a new build.
	Replace bool
	// OneShotPool is how many sandboxed sessions the helper keeps ready
	// for one-shot runs (pool.go): 0 means DefaultPoolSize, a negative
	// number none.
	OneShotPool int
}

// replaceWait bounds how long Replace waits for the old helper to end.
const replaceWait = 20 * time.Second

// Serve runs the resident helper until ctx ends, then ends its jobs.
func (a *Agent) Serve(ctx context.Context, o ServeOptions) error {
	if o.Socket == "" {
		o.Socket = SocketPath(a.cfg.Root)
	}
	unlock, err := a.serveLock()
	var already *AlreadyServingError
	if o.Replace && errors.As(err, &already) {
		unlock, err = a.replace(ctx, already.PID)
	}
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.res = &resident{jobs: newJobTable(a, ctx)}
	a.res.threads = newThreadCache()
	if o.OneShotPool == 0 {
		o.OneShotPool = DefaultPoolSize
	}
	if o.OneShotPool > 0 {
		a.res.pool = newSessionPool(a, o.OneShotPool)
		a.res.pool.recover()
	}
	if !o.KeepProcess {
		a.res.oomLowered = a.harden()
	}
	if err := a.helloInfo(); err != nil {
		return err
	}
	a.res.jobs.recover(ctx)
	ln, err := listenPrivate(o.Socket)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	port := a.firstPort(o.Port)
	srv := &mux.Server{Handler: a.handle, Hello: a.helloJSON, Logger: a.cfg.Logger}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.serveSocket(ctx, srv, ln) }()
	go func() { defer wg.Done(); a.servePort(ctx, srv, o.Port, port) }()
	go a.janitor(ctx)
	if o.Ready != nil {
		o.Ready(a.res.hello)
	}
	<-ctx.Done()
	ln.Close()
	a.endJobs()
	wg.Wait()
	if a.res.pool != nil {
		a.res.pool.close()
	}
	a.res.threads.close()
	return nil
}

// serveLock takes <Root>/serve.lock for the helper's life.
func (a *Agent) serveLock() (unlock func(), err error) {
	if err := os.MkdirAll(a.cfg.Root, 0o711); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(a.cfg.Root, serveLockName), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &AlreadyServingError{PID: atoiOr0(strings.TrimSpace(string(b)))}
		}
		return nil, fmt.Errorf("serve: lock: %w", err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

// replace ends the helper pid (only if it is a vmgate-guest) and takes
// the lock once it is free.
func (a *Agent) replace(ctx context.Context, pid int) (unlock func(), err error) {
	if pid <= 1 || a.proc.exeBase(pid) != selfName {
		return nil, fmt.Errorf("serve: replace: the lock's holder %d is not a vmgate-guest", pid)
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	deadline := time.Now().Add(replaceWait)
	killed := false
	for {
		unlock, err := a.serveLock()
		if !errors.Is(err, ErrAlreadyServing) {
			return unlock, err
		}
		if time.Now().After(deadline) {
			if killed {
				return nil, fmt.Errorf("serve: replace: pid %d still holds the lock after SIGKILL", pid)
			}
			_ = unix.Kill(pid, unix.SIGKILL)
			killed, deadline = true, time.Now().Add(5*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AlreadyServingError names the helper that holds the lock.
type AlreadyServingError struct{ PID int }

func (e *AlreadyServingError) Error() string {
	return fmt.Sprintf("serve: %v (pid %d)", ErrAlreadyServing, e.PID)
}

func (e *AlreadyServingError) Unwrap() error { return ErrAlreadyServing }

func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// harden makes the helper undumpable, lowers its OOM score and moves it to
// its own cgroup; it reports whether the OOM score was lowered. Each step
// that fails is logged: the helper still serves.
func (a *Agent) harden() (oomLowered bool) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		a.cfg.Logger.Warn("serve: not dumpable", "err", err)
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(lowOOMScore)), 0); err != nil {
		a.cfg.Logger.Warn("serve: oom_score_adj", "err", err)
	} else {
		oomLowered = true
	}
	if err := a.ownCgroup(); err != nil {
		a.cfg.Logger.Warn("serve: own cgroup", "err", err)
	}
	return oomLowered
}

// ownCgroup moves the helper into <cgroup root>/helperCgroup, unless it is
// in systemd's unit for it already.
func (a *Agent) ownCgroup() error {
	if !a.cgroupUsable() {
		return nil
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok && strings.HasSuffix(p, "/"+UnitName) {
			return nil
		}
	}
	dir := filepath.Join(a.cfg.CgroupRoot, helperCgroup)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
}

// helloInfo fills the helper's hello: the running binary's hash among it.
func (a *Agent) helloInfo() error {
	sum, err := selfSHA256()
	if err != nil {
		return fmt.Errorf("serve: hashing the running binary: %w", err)
	}
	v := VersionInfo()
	a.res.hello = wire.Hello{Proto: wire.Proto, Version: v.Version, GOOS: v.GOOS, GOARCH: v.GOARCH,
		SHA256: sum, PID: os.Getpid(), Resident: true, StartedAt: time.Now().UnixMilli()}
	return nil
}

func selfSHA256() (string, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Hello answers `vmgate-guest hello`: the resident helper's hello, or a
// per-command process's own.
func (a *Agent) Hello() (wire.Hello, error) {
	if a.res != nil {
		h := a.res.hello
		a.res.jobs.mu.Lock()
		h.Jobs = a.res.jobs.runningLocked()
		a.res.jobs.mu.Unlock()
		if p := a.res.pool; p != nil {
			p.mu.Lock()
			st := p.statsLocked()
			p.mu.Unlock()
			h.Pool = &st
		}
		a.res.threads.mu.Lock()
		ts := a.res.threads.statsLocked()
		a.res.threads.mu.Unlock()
		h.Threads = &ts
		a.res.stepsMu.Lock()
		h.StepsUS = maps.Clone(a.res.steps)
		a.res.stepsMu.Unlock()
		return h, nil
	}
	sum, err := selfSHA256()
	if err != nil {
		return wire.Hello{}, fmt.Errorf("hello: %w", err)
	}
	v := VersionInfo()
	return wire.Hello{Proto: wire.Proto, Version: v.Version, GOOS: v.GOOS, GOARCH: v.GOARCH, SHA256: sum, PID: os.Getpid()}, nil
}

func (a *Agent) helloJSON() []byte {
	var out bytes.Buffer
	a.Main(context.Background(), []string{"hello"}, nil, &out)
	return bytes.TrimSpace(out.Bytes())
}

// handle runs one call: the command line through Main, as a process per
// command would, its reply on "stdout". The caller's wait bounds it.
func (a *Agent) handle(ctx context.Context, req mux.Request) mux.Reply {
	if req.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	var out bytes.Buffer
	code := a.Main(ctx, req.Args, bytes.NewReader(req.Stdin), &out)
	return mux.Reply{Exit: code, Stdout: out.Bytes()}
}

// listenPrivate listens on a unix socket at path, 0600 in a 0700
// directory of root's (a stale socket there is replaced).
func listenPrivate(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	return ln, os.Chmod(path, 0o600)
}

// serveSocket serves each connection whose peer is root.
func (a *Agent) serveSocket(ctx context.Context, srv *mux.Server, ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil {
				a.cfg.Logger.Error("serve: socket", "err", err)
			}
			return
		}
		if uid, err := peerUID(c); err != nil || uid != 0 {
			a.cfg.Logger.Warn("serve: refusing a connection", "uid", uid, "err", err)
			c.Close()
			continue
		}
		go func() { _ = srv.ServeConn(ctx, c) }()
	}
}

func peerUID(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	uid := -1
	var uerr error
	if err := rc.Control(func(fd uintptr) {
		var cred *unix.Ucred
		cred, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if uerr == nil {
			uid = int(cred.Uid)
		}
	}); err != nil {
		return -1, err
	}
	return uid, uerr
}

// firstPort opens the port named name before the helper serves (its
// device goes into the hello); nil without one, or when it cannot be
// opened now (servePort tries again).
func (a *Agent) firstPort(name string) *os.File {
	if name == "" {
		return nil
	}
	f, dev, err := a.openPort(name)
	if err != nil {
		if !errors.Is(err, ErrNoPort) {
			a.cfg.Logger.Error("serve: port", "port", name, "err", err)
		}
		return nil
	}
	a.res.hello.Port = dev
	return f
}

// servePort serves the virtio-serial port named name (first, when open
// already), reopening it after an error; it returns when ctx ends or the
// guest has no such port.
func (a *Agent) servePort(ctx context.Context, srv *mux.Server, name string, first *os.File) {
	if name == "" {
		return
	}
	for ctx.Err() == nil {
		f, err := first, error(nil)
		if f == nil {
			f, _, err = a.openPort(name)
		}
		first = nil
		if errors.Is(err, ErrNoPort) {
			a.cfg.Logger.Info("serve: no virtio-serial port; serving the socket only", "port", name)
			return
		}
		if err == nil {
			stop := context.AfterFunc(ctx, func() { f.Close() })
			err = srv.ServePort(ctx, f)
			stop()
			f.Close()
		}
		if ctx.Err() != nil {
			return
		}
		a.cfg.Logger.Error("serve: port", "port", name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// janitor forgets ended jobs past their keep time and ends the session
// threads unused or old (threadCache.expire).
func (a *Agent) janitor(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.res.jobs.expire(now, false)
			a.res.threads.expire(now)
		}
	}
}

// endJobs waits for every job to end (the helper's context, which each
// job's derives from, has ended, so each tree is being killed).
func (a *Agent) endJobs() {
	a.res.jobs.mu.Lock()
	var done []chan struct{}
	for _, j := range a.res.jobs.byID {
		done = append(done, j.done)
	}
	a.res.jobs.mu.Unlock()
	for _, d := range done {
		<-d
	}
}
