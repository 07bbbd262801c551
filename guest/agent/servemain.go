//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/guest/mux"
)

// ServeCommand and CallCommand are the argv[1] of the commands that are not
// in the dispatch (they do not answer with one reply of their own).
const (
	ServeCommand = "serve"
	CallCommand  = "call"
)

// detachWait bounds how long `serve --detach` waits for the helper to listen.
const detachWait = 30 * time.Second

// ServeMain runs `vmgate-guest serve [--detach] [--replace] [--port NAME] [--socket PATH] [--oneshot-pool N]`:
// in the foreground until SIGTERM or SIGINT; with --detach it starts the
// helper in a session of its own (the guest agent's exec returns, the
// helper stays) and answers with one wire.Reply (wire.Serving) once it
// listens or one already did. It returns the exit status.
func (a *Agent) ServeMain(args []string, stdout io.Writer) int {
	fs := newFlags("serve")
	detach := fs.Bool("detach", false, "start in the background and answer once it listens")
	port := fs.String("port", PortName, "virtio-serial port to serve (\"\": none)")
	socket := fs.String("socket", SocketPath(a.cfg.Root), "unix socket to serve")
	readyFD := fs.Int("ready-fd", 0, "descriptor to report readiness on (used by --detach)")
	replace := fs.Bool("replace", false, "end the helper that serves already and serve in its place")
	pool := fs.Int("oneshot-pool", DefaultPoolSize, "sandboxed sessions kept ready for one-shot runs (0: none)")
	if err := parseFlags(fs, args); err != nil {
		return a.reply(stdout, nil, err)
	}
	if *pool < 0 || *pool > maxPoolSize {
		return a.reply(stdout, nil, invalidf("serve: --oneshot-pool %d: want 0..%d", *pool, maxPoolSize))
	}
	if *detach {
		res, err := a.detach(*port, *socket, *replace, *pool)
		return a.reply(stdout, res, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP)
	var ready *os.File
	if *readyFD > 2 {
		ready = os.NewFile(uintptr(*readyFD), "ready")
	}
	report := func(v any) {
		if ready != nil {
			_ = json.NewEncoder(ready).Encode(v)
			ready.Close()
			ready = nil
		}
	}
	size := *pool
	if size == 0 {
		size = -1 // none (ServeOptions' 0 is the default)
	}
	err := a.Serve(ctx, ServeOptions{Port: *port, Socket: *socket, Replace: *replace, OneShotPool: size, Ready: func(h wire.Hello) {
		report(wire.Reply{OK: true, Result: wire.Serving{PID: h.PID}})
	}})
	var already *AlreadyServingError
	switch {
	case errors.As(err, &already):
		report(wire.Reply{OK: true, Result: wire.Serving{PID: already.PID, Already: true}})
		return 0
	case err != nil:
		report(wire.Reply{Error: &wire.Error{Code: wire.CodeFailed, Message: err.Error()}})
		a.cfg.Logger.Error("serve", "err", err)
		return 1
	}
	return 0
}

// reply writes one wire.Reply for res or err, as Main does.
func (a *Agent) reply(w io.Writer, res any, err error) int {
	r := wire.Reply{OK: err == nil, Result: res}
	if err != nil {
		we := &wire.Error{Code: wire.CodeFailed, Message: err.Error()}
		errors.As(err, &we)
		r.Result, r.Error = nil, we
	}
	if werr := json.NewEncoder(w).Encode(r); werr != nil {
		return 2
	}
	if err != nil {
		return 1
	}
	return 0
}

// detach starts `serve --ready-fd 3` as a new session whose output goes to
// <Root>/helper/serve.log, and waits for what it reports.
func (a *Agent) detach(port, socket string, replace bool, pool int) (wire.Serving, error) {
	dir := filepath.Dir(SocketPath(a.cfg.Root))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wire.Serving{}, fmt.Errorf("serve: %w", err)
	}
	logf, err := openLog(filepath.Join(dir, "serve.log"))
	if err != nil {
		return wire.Serving{}, fmt.Errorf("serve: %w", err)
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return wire.Serving{}, fmt.Errorf("serve: %w", err)
	}
	defer pr.Close()
	args := []string{ServeCommand, "--port", port, "--socket", socket, "--ready-fd", "3", "--oneshot-pool", strconv.Itoa(pool)}
	if replace {
		args = append(args, "--replace")
	}
	// The program's own path, not /proc/self/exe: the process's name
	// (comm) comes from it, and kill and the host know the helper by it.
	self, err := os.Executable()
	if err != nil {
		return wire.Serving{}, fmt.Errorf("serve: %w", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = "/", logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return wire.Serving{}, fmt.Errorf("serve: start: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reaped if it ends while we wait; init adopts it otherwise
	_ = pr.SetReadDeadline(time.Now().Add(detachWait))
	var r struct {
		OK     bool         `json:"ok"`
		Result wire.Serving `json:"result"`
		Error  *wire.Error  `json:"error"`
	}
	if err := json.NewDecoder(pr).Decode(&r); err != nil {
		return wire.Serving{}, fmt.Errorf("serve: the helper (pid %d) did not report it listens: %v; see %s", cmd.Process.Pid, err, logf.Name())
	}
	if !r.OK {
		if r.Error == nil {
			r.Error = &wire.Error{Code: wire.CodeFailed, Message: "serve: failed"}
		}
		return wire.Serving{}, r.Error
	}
	return r.Result, nil
}

// openLog opens the helper's log for appending, emptied first when it has
// grown past 1 MiB: one open (O_NOFOLLOW), then its size and the
// truncation through that descriptor.
func openLog(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > 1<<20 {
		_ = f.Truncate(0)
	}
	return f, nil
}

// CallMain runs `vmgate-guest call ARGS...`: it sends ARGS and its
// standard input to the resident helper through the helper's socket and
// writes the helper's reply, exactly what `vmgate-guest ARGS` would have
// written, exiting with its status. Without a helper to call it answers
// with a reply whose reason is wire.ReasonNoHelper and exits wire.ExitNoHelper. It
// skips everything but the call (no Agent).
func CallMain(root string, args []string, stdin io.Reader, stdout io.Writer) int {
	in, err := io.ReadAll(io.LimitReader(stdin, mux.MaxMessageBytes))
	if err != nil {
		return noHelper(stdout, fmt.Errorf("call: reading stdin: %w", err))
	}
	c, err := net.DialTimeout("unix", SocketPath(root), 5*time.Second)
	if err != nil {
		return noHelper(stdout, fmt.Errorf("call: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, _, err := mux.Dial(ctx, c)
	cancel()
	if err != nil {
		return noHelper(stdout, fmt.Errorf("call: %w", err))
	}
	defer cl.Close()
	rep, err := cl.Call(context.Background(), mux.Request{Args: args, Stdin: in})
	if err != nil {
		return noHelper(stdout, fmt.Errorf("call: %w", err))
	}
	if _, err := stdout.Write(rep.Stdout); err != nil {
		return 2
	}
	return rep.Exit
}

// callResident sends one command to the resident helper through its
// socket and fails unless it answers ok.
func callResident(ctx context.Context, root string, args []string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", SocketPath(root))
	if err != nil {
		return err
	}
	cl, _, err := mux.Dial(ctx, c)
	if err != nil {
		c.Close()
		return err
	}
	defer cl.Close()
	rep, err := cl.Call(ctx, mux.Request{Args: args})
	if err != nil {
		return err
	}
	if rep.Exit != 0 {
		return fmt.Errorf("%s: exit %d: %s", strings.Join(args, " "), rep.Exit, bytes.TrimSpace(rep.Stdout))
	}
	return nil
}

func noHelper(w io.Writer, err error) int {
	b, _ := json.Marshal(wire.Reply{Error: &wire.Error{Code: wire.CodeFailed, Reason: wire.ReasonNoHelper, Message: err.Error()}})
	fmt.Fprintf(w, "%s\n", b)
	return wire.ExitNoHelper
}
