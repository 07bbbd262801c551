package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// qmpQuit connects to a QMP socket, negotiates capabilities and sends quit.
func qmpQuit(ctx context.Context, sock string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("lab: qmp: dial: %w", err)
	}
	defer c.Close()
	dl := time.Now().Add(3 * time.Second)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	if err := c.SetDeadline(dl); err != nil {
		return fmt.Errorf("lab: qmp: %w", err)
	}
	r := bufio.NewReader(c)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return fmt.Errorf("lab: qmp: greeting: %w", err)
	}
	for _, cmd := range []string{"qmp_capabilities", "quit"} {
		if _, err := fmt.Fprintf(c, "{\"execute\":%q}\n", cmd); err != nil {
			return fmt.Errorf("lab: qmp: %s: %w", cmd, err)
		}
		for { // skip events until the reply
			line, err := r.ReadBytes('\n')
			if err != nil {
				return fmt.Errorf("lab: qmp: %s: %w", cmd, err)
			}
			var rep struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Desc string `json:"desc"`
				} `json:"error"`
			}
			if err := json.Unmarshal(line, &rep); err != nil {
				return fmt.Errorf("lab: qmp: %s: bad reply %q: %w", cmd, line, err)
			}
			if rep.Error != nil {
				return fmt.Errorf("lab: qmp: %s: %s", cmd, rep.Error.Desc)
			}
			if rep.Return != nil {
				break
			}
		}
	}
	return nil
}
