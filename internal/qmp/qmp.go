// Package qmp is a one-shot client of QEMU's monitor (QMP) for the lab's
// QEMU processes and the emulators that stand on them (internal/lab,
// internal/pveemu, internal/vboxemu): Call connects, negotiates
// capabilities, runs one command and closes, since QEMU's monitor serves one
// client at a time and nothing should hold it between calls. StateImage
// keeps the internal snapshots (memory and device state) of a lab VM that
// has no disk of its own. The QEMU driver's long-lived monitor with events
// is plugins/qemu's Monitor.
//
// Calls are bounded by their context only; callers set deadlines. Callers
// that share a socket serialise their calls (a second client waits for the
// first to leave).
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// Error is an error reply of QEMU's monitor.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return e.Desc }

// Call connects to the QMP socket sock, negotiates capabilities, runs
// command with args (nil for none) and returns its "return" value. Events
// before the reply are skipped; an error reply is an *Error.
func Call(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return nil, fmt.Errorf("qmp: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReader(c)
	if _, err := r.ReadBytes('\n'); err != nil {
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	if _, err := roundTrip(c, r, "qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return roundTrip(c, r, command, args)
}

func roundTrip(c net.Conn, r *bufio.Reader, command string, args any) (json.RawMessage, error) {
	msg := map[string]any{"execute": command}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", command, err)
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", command, err)
	}
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp: %s: %w", command, err)
		}
		var rep struct {
			Return json.RawMessage `json:"return"`
			Error  *Error          `json:"error"`
			Event  string          `json:"event"`
			QMP    json.RawMessage `json:"QMP"`
		}
		if err := json.Unmarshal(line, &rep); err != nil {
			return nil, fmt.Errorf("qmp: %s: bad reply %q: %w", command, line, err)
		}
		switch {
		case rep.Error != nil:
			return nil, rep.Error
		case rep.Event != "", rep.QMP != nil:
			// An event, or a greeting seen again (QEMU greets each client it
			// accepts; one was seen here under load after the first): skipped.
			continue
		case rep.Return != nil:
			return rep.Return, nil
		}
		return nil, fmt.Errorf("qmp: %s: reply without return: %q", command, line)
	}
}
