package proxmox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/keypace"
)

// The display and the keyboard through Proxmox's API, not the guest agent
// (qemu-server src/PVE/API2/Qemu.pm; every call needs VM.Console):
//
//   - SendKeys: PUT .../sendkey with key set to a combination as QEMU's
//     HMP sendkey reads it ("ctrl-alt-delete": the key model's names are
//     QEMU's), one request per combination, paced as QEMU presses keys
//     (vm_sendkey runs HMP sendkey, which queues the keys as send-key does:
//     plugins/internal/keypace).
//   - Screenshot: POST .../vncproxy with websocket=1 (a VNC password and a
//     ticket for a port), then GET .../vncwebsocket with that port and
//     ticket upgraded to a websocket, over which pveproxy relays the VM's
//     VNC server: one frame read with a small RFB 3.8 client (rfb.go).

var (
	_ hypervisor.Screener  = (*Driver)(nil)
	_ hypervisor.KeySender = (*Driver)(nil)
)

// SendKeys presses req's keys with one sendkey request per combination.
func (d *Driver) SendKeys(ctx context.Context, name string, req hypervisor.KeysRequest) error {
	const op = "send keys"
	presses, err := req.Presses()
	if err != nil {
		return fmt.Errorf("proxmox: %w", err)
	}
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return err
	}
	var pace keypace.Pacer
	for _, combo := range presses {
		if err := pace.Before(ctx, len(combo)); err != nil {
			return d.classify(op, err)
		}
		if err := d.api.do(ctx, "PUT", v.path+"/sendkey", nil, map[string]any{"key": combo.String()}, nil); err != nil {
			return d.classify(op, err)
		}
	}
	if err := pace.Drain(ctx); err != nil {
		return d.classify(op, err)
	}
	return nil
}

// vncProxyAnswer is what vncproxy and termproxy return.
type vncProxyAnswer struct {
	User     string  `json:"user"`
	Ticket   string  `json:"ticket"`
	Port     flexInt `json:"port"`
	UPID     string  `json:"upid"`
	Password string  `json:"password"`
}

// Screenshot reads one frame of the VM's display over VNC.
func (d *Driver) Screenshot(ctx context.Context, name string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	const op = "screenshot"
	if err := req.Validate(); err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("proxmox: %w", err)
	}
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return hypervisor.Screenshot{}, err
	}
	var ans vncProxyAnswer
	if err := d.api.do(ctx, "POST", v.path+"/vncproxy", nil, map[string]any{"websocket": 1}, &ans); err != nil {
		return hypervisor.Screenshot{}, d.classify(op, err)
	}
	if ans.Password == "" {
		return hypervisor.Screenshot{}, fmt.Errorf("proxmox: %s: %w: vncproxy handed out no VNC password (is the VM's display a serial terminal? set vga to std)", op, hypervisor.ErrNotSupported)
	}
	ws, err := d.api.dialVNCWebsocket(ctx, v.path, int(ans.Port), ans.Ticket)
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrBackend, err)
	}
	defer ws.Close()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(time.Minute)
	}
	ws.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { ws.Close() })
	defer stop()
	img, err := rfbFrame(ws, ans.Password)
	if err != nil {
		if ctx.Err() != nil {
			return hypervisor.Screenshot{}, d.classify(op, ctx.Err())
		}
		return hypervisor.Screenshot{}, fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrBackend, err)
	}
	shot, err := hypervisor.NewScreenshot(img, req.MaxWidth)
	if err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("proxmox: %w", err)
	}
	return shot, nil
}

// flexInt is an integer Proxmox may send as a number or a string.
type flexInt int

func (f *flexInt) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("not an integer: %s", b)
	}
	*f = flexInt(n)
	return nil
}
