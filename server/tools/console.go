package tools

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// The serial console of a VM: vm_console_read (read-only: what the guest
// wrote, by byte offsets) and vm_console_write (destructive and
// open-world: input to whatever listens there, often a root shell or a
// login). Both go through the hypervisor (hypervisor.ConsoleReader,
// hypervisor.ConsoleWriter), never the guest agent. A backend without the
// capability (VirtualBox has no console input) is a [BACKEND ERROR]
// naming what it lacks.

func consoleReadTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_console_read", Title: "Read a VM's serial console", ReadOnly: true, Idempotent: true,
		Desc: "Read what a VM wrote to its serial console (boot messages, a kernel panic, a shell's output), through the hypervisor: " +
			"it works without the guest agent. Output is numbered by byte offsets: pass the cursor of one read as since of the next to get " +
			"only what came after, or tail_bytes for the last bytes. dropped counts bytes the backend no longer kept; reset says the console " +
			"started over (the VM was restarted). Text comes back as data, output that is not UTF-8 as data_base64.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "since", Kind: catalog.KindInteger, Desc: "A cursor from an earlier read: return what came after it (default 0: everything still kept).", Min: 0, Max: 1 << 62},
			{Name: "tail_bytes", Kind: catalog.KindInteger, Desc: "Return the last this many bytes instead (not with since).", Min: 1, Max: hypervisor.MaxConsoleReadBytes},
			{Name: "max_bytes", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Return at most this many bytes (default %d); more says there is more.", hypervisor.DefaultConsoleReadBytes),
				Min: 1, Max: hypervisor.MaxConsoleReadBytes, Default: int64(hypervisor.DefaultConsoleReadBytes)},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "data": catalog.OString(), "data_base64": catalog.OString(), "bytes": catalog.ONonNeg(),
			"start": catalog.ONonNeg(), "cursor": catalog.ONonNeg(), "dropped": catalog.ONonNeg(), "more": catalog.OBoolean(), "reset": catalog.OBoolean(),
		}, "vm", "bytes", "start", "cursor", "dropped", "more", "reset")},
	}, runConsoleRead)
}

// consoleReadArgs are vm_console_read's arguments.
type consoleReadArgs struct {
	Since     int64 `arg:"since"`
	TailBytes int64 `arg:"tail_bytes"`
	MaxBytes  int64 `arg:"max_bytes"`
}

func (a *consoleReadArgs) request() hypervisor.ConsoleReadRequest {
	return hypervisor.ConsoleReadRequest{Since: a.Since, TailBytes: int(a.TailBytes), MaxBytes: int(a.MaxBytes)}
}

// CheckArgs: the request as the driver checks it (catalog.ArgChecker).
func (a *consoleReadArgs) CheckArgs() error { return argError(a.request().Validate()) }

func runConsoleRead(e *catalog.Env, c *catalog.Call, a *consoleReadArgs) catalog.Result {
	cr, ok := hypervisor.AsConsoleReader(c.Driver)
	if !ok {
		return lacks(c, "read a VM's serial console")
	}
	ch, err := cr.ConsoleRead(c.Ctx, c.Name, a.request())
	if err != nil {
		return catalog.DriverFailure(err)
	}
	out := map[string]any{"vm": c.VM, "bytes": len(ch.Data), "start": ch.Start, "cursor": ch.Cursor,
		"dropped": ch.Dropped, "more": ch.More, "reset": ch.Reset}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: console bytes %d to %d (%d bytes", c.VM, ch.Start, ch.Cursor, len(ch.Data))
	if ch.Dropped > 0 {
		fmt.Fprintf(&b, "; %d before them no longer kept", ch.Dropped)
	}
	if ch.Reset {
		b.WriteString("; the console started over")
	}
	if ch.More {
		fmt.Fprintf(&b, "; more after: read again with since %d", ch.Cursor)
	}
	b.WriteString(")")
	if utf8.Valid(ch.Data) {
		out["data"] = string(ch.Data)
		if len(ch.Data) > 0 {
			b.WriteString(":\n")
			b.Write(ch.Data)
		}
	} else {
		out["data_base64"] = base64.StdEncoding.EncodeToString(ch.Data)
		b.WriteString(", not UTF-8: see data_base64")
	}
	return catalog.Success(out, b.String())
}

func consoleWriteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_console_write", Title: "Write to a VM's serial console", Destructive: true, OpenWorld: true,
		Desc: "Send text to a VM's serial console, as typed on a serial terminal (\\n ends a line; \\u0003 is Ctrl+C), through the hypervisor: " +
			"it works without the guest agent. Whatever listens there (a root shell, a login) gets it; read the answer with vm_console_read. " +
			"The audit log keeps the text only as its SHA-256 and length.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "text", Kind: catalog.KindString, Desc: fmt.Sprintf("The text to send, at most %d bytes.", hypervisor.MaxConsoleWriteBytes),
				Required: true, MaxLen: hypervisor.MaxConsoleWriteBytes},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "bytes": catalog.ONonNeg()}, "vm", "bytes")},
	}, runConsoleWrite)
}

// consoleWriteArgs are vm_console_write's arguments.
type consoleWriteArgs struct {
	Text string `arg:"text"`
}

// CheckArgs: the data as the driver checks it (catalog.ArgChecker).
func (a *consoleWriteArgs) CheckArgs() error {
	return argError(hypervisor.ValidateConsoleWrite([]byte(a.Text)))
}

func runConsoleWrite(e *catalog.Env, c *catalog.Call, a *consoleWriteArgs) catalog.Result {
	cw, ok := hypervisor.AsConsoleWriter(c.Driver)
	if !ok {
		return lacks(c, "write to a VM's serial console")
	}
	if err := cw.ConsoleWrite(c.Ctx, c.Name, []byte(a.Text)); err != nil {
		return catalog.DriverFailure(err)
	}
	return catalog.Success(map[string]any{"vm": c.VM, "bytes": len(a.Text)},
		fmt.Sprintf("%s: %d bytes written to the serial console; vm_console_read shows the answer", c.VM, len(a.Text)))
}
