package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// AgentError is an {"error": {...}} reply from the guest agent.
type AgentError struct {
	Command string
	Class   string
	Desc    string
}

func (e *AgentError) Error() string {
	return fmt.Sprintf("lab: agent: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// agentConn is a minimal guest-agent client for readiness and status: it
// resynchronises with guest-sync-delimited and then makes plain calls. It
// is not safe for concurrent use; the lab holds one only briefly, because
// QEMU's chardev serves a single client at a time.
type agentConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialAgent(ctx context.Context, sock string) (*agentConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("lab: agent: dial: %w", err)
	}
	return &agentConn{conn: c, r: bufio.NewReader(c)}, nil
}

func (a *agentConn) Close() error { return a.conn.Close() }

// sync sends guest-sync-delimited until the agent echoes the id, reading
// past stale replies and parse errors. Until the guest has booted nothing
// answers, so each attempt waits a little longer, until ctx ends.
func (a *agentConn) sync(ctx context.Context) error {
	wait := 300 * time.Millisecond
	for {
		id := rand.Int64N(1 << 40)
		msg, _ := json.Marshal(map[string]any{"execute": "guest-sync-delimited", "arguments": map[string]any{"id": id}})
		if err := a.deadline(ctx, wait); err != nil {
			return err
		}
		if _, err := a.conn.Write(append([]byte{0xff}, msg...)); err != nil {
			return a.ioErr(ctx, "guest-sync-delimited", err)
		}
		for {
			line, err := a.readLine()
			if err != nil {
				if isTimeout(err) && ctx.Err() == nil {
					break // resend with a new id
				}
				return a.ioErr(ctx, "guest-sync-delimited", err)
			}
			var rep struct {
				Return *int64 `json:"return"`
			}
			if json.Unmarshal(line, &rep) == nil && rep.Return != nil && *rep.Return == id {
				return nil
			}
		}
		if wait < 2*time.Second {
			wait *= 2
		}
	}
}

// call sends one command and decodes its "return" into out (when non-nil).
func (a *agentConn) call(ctx context.Context, command string, args, out any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("lab: agent: %s: %w", command, err)
	}
	if err := a.deadline(ctx, 10*time.Second); err != nil {
		return err
	}
	if _, err := a.conn.Write(msg); err != nil {
		return a.ioErr(ctx, command, err)
	}
	line, err := a.readLine()
	if err != nil {
		return a.ioErr(ctx, command, err)
	}
	var rep struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return fmt.Errorf("lab: agent: %s: bad reply %q: %w", command, line, err)
	}
	if rep.Error != nil {
		return &AgentError{Command: command, Class: rep.Error.Class, Desc: rep.Error.Desc}
	}
	if rep.Return == nil {
		return fmt.Errorf("lab: agent: %s: reply without return: %q", command, line)
	}
	if out != nil {
		if err := json.Unmarshal(rep.Return, out); err != nil {
			return fmt.Errorf("lab: agent: %s: decode %q: %w", command, rep.Return, err)
		}
	}
	return nil
}

// readLine returns the next non-empty reply line without delimiter bytes.
func (a *agentConn) readLine() ([]byte, error) {
	for {
		line, err := a.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSpace(bytes.Trim(line, "\xff"))
		if len(line) > 0 {
			return line, nil
		}
	}
}

// deadline sets the I/O deadline to the earlier of now+d and ctx's deadline.
func (a *agentConn) deadline(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lab: agent: %w", err)
	}
	t := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		t = dl
	}
	return a.conn.SetDeadline(t)
}

func (a *agentConn) ioErr(ctx context.Context, command string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("lab: agent: %s: %w: %w", command, hypervisor.ErrAgentUnavailable, ctx.Err())
	}
	return fmt.Errorf("lab: agent: %s: %w: %w", command, hypervisor.ErrAgentUnavailable, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// withAgent dials the VM's agent socket, synchronises and runs f.
func (v *VM) withAgent(ctx context.Context, f func(*agentConn) error) error {
	a, err := dialAgent(ctx, v.QGASocket)
	if err != nil {
		return fmt.Errorf("%w: %w", hypervisor.ErrAgentUnavailable, err)
	}
	defer a.Close()
	// Closing the connection is what unblocks I/O when ctx is cancelled
	// without a deadline.
	stop := context.AfterFunc(ctx, func() { a.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := a.sync(ctx); err != nil {
		return err
	}
	return f(a)
}

// Ping checks that the guest agent answers guest-ping.
func (v *VM) Ping(ctx context.Context) error {
	return v.withAgent(ctx, func(a *agentConn) error { return a.call(ctx, "guest-ping", nil, nil) })
}

// AgentInfo returns guest-info: the agent version and its enabled commands.
func (v *VM) AgentInfo(ctx context.Context) (hypervisor.AgentInfo, error) {
	var info struct {
		Version  string `json:"version"`
		Commands []struct {
			Name    string `json:"name"`
			Enabled bool   `json:"enabled"`
		} `json:"supported_commands"`
	}
	err := v.withAgent(ctx, func(a *agentConn) error { return a.call(ctx, "guest-info", nil, &info) })
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	out := hypervisor.AgentInfo{Version: info.Version}
	for _, c := range info.Commands {
		out.Commands = append(out.Commands, hypervisor.AgentCommand{Name: c.Name, Enabled: c.Enabled})
	}
	return out, nil
}

// AgentCall runs one guest-agent command after a resync and decodes its
// "return" into out (when non-nil). An {"error": ...} reply is an
// *AgentError. Meant for tests and diagnostics; vmgate's drivers use the
// full client of package guest/qga.
func (v *VM) AgentCall(ctx context.Context, command string, args, out any) error {
	return v.withAgent(ctx, func(a *agentConn) error { return a.call(ctx, command, args, out) })
}
