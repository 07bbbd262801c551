package pveemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// qmpError is an error reply of QEMU's monitor.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Desc }

// qmpCall connects to a QMP socket, negotiates capabilities, runs one
// command and returns its "return" value. Events are skipped. The monitor
// accepts one client at a time, so the connection lives only for the call;
// callers serialise calls per machine.
func qmpCall(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return nil, err
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
		return nil, err
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
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := json.Unmarshal(line, &rep); err != nil {
			return nil, fmt.Errorf("qmp: %s: bad reply %q: %w", command, line, err)
		}
		switch {
		case rep.Error != nil:
			return nil, rep.Error
		case rep.Event != "":
			continue
		case rep.Return != nil:
			return rep.Return, nil
		}
		return nil, fmt.Errorf("qmp: %s: reply without return: %s", command, line)
	}
}
