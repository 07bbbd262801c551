package vboxemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// qmpExec connects to a lab VM's QMP socket, negotiates capabilities and
// runs one command; events before the reply are skipped. The VM process
// of the emulated host is that QEMU: reset, pause and power go to it.
func qmpExec(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	defer c.Close()
	dl := time.Now().Add(10 * time.Second)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	c.SetDeadline(dl)
	r := bufio.NewReader(c)
	if _, err := r.ReadBytes('\n'); err != nil {
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	if _, err := qmpRoundTrip(c, r, "qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return qmpRoundTrip(c, r, command, args)
}

func qmpRoundTrip(c net.Conn, r *bufio.Reader, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	raw, _ := json.Marshal(req)
	if _, err := c.Write(append(raw, '\n')); err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", command, err)
	}
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp: %s: %w", command, err)
		}
		var rep struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &rep); err != nil {
			return nil, fmt.Errorf("qmp: %s: bad reply %q: %w", command, line, err)
		}
		if rep.Error != nil {
			return nil, fmt.Errorf("qmp: %s: %s", command, rep.Error.Desc)
		}
		if rep.Return != nil {
			return rep.Return, nil
		}
	}
}
