package tools

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// The screen and keyboard of a VM: vm_screenshot (read-only) and
// vm_send_keys (destructive and open-world: keys on a root console are as
// strong as a command). Both go through the hypervisor alone
// (hypervisor.Screener, hypervisor.KeySender), never the guest agent, so
// they work for a guest stuck at boot, at a login or installer screen, or
// with its agent dead. A backend without the capability is a
// [BACKEND ERROR] naming what it lacks.

// defaultScreenshotBytes is vm_screenshot's max_bytes when the call sets
// none (within the server's output cap): a 720×400 text console is about
// 10 KiB as a PNG, a 1280×800 desktop a few hundred.
const defaultScreenshotBytes = 1 << 20

// minScreenshotBytes is the smallest max_bytes: a PNG of the smallest
// width still fits.
const minScreenshotBytes = 1024

// keyPressTime is what one key press takes at most as the backends pace
// them (QEMU presses a key in about 20 ms; a shifted character is two
// keys): the room vm_send_keys gets per press beyond the call timeout.
const keyPressTime = 50 * time.Millisecond

func screenshotTool(l catalog.Limits) *catalog.Tool {
	def := min(int64(defaultScreenshotBytes), l.MaxOutputBytes)
	return catalog.NewTool(catalog.Tool{
		Name: "vm_screenshot", Title: "Screenshot a VM", ReadOnly: true, Idempotent: true,
		Desc: "Capture a VM's display as a PNG image (MCP image content), through the hypervisor: it works without the guest agent " +
			"(a VM stuck at boot, a login or installer screen, a panic). width and height are in structuredContent. " +
			"max_width scales a wider display down (an 80x25 text console is 720 px wide and stays legible at 640).",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "max_width", Kind: catalog.KindInteger, Desc: "Scale a wider display down to this width in pixels, keeping its aspect ratio. Default: the display's own size.",
				Min: hypervisor.MinScreenshotWidth, Max: hypervisor.MaxScreenshotWidth},
			{Name: "max_bytes", Kind: catalog.KindInteger, Desc: fmt.Sprintf("Largest PNG to return, in bytes (default %d); a larger screen is scaled down to fit.", def),
				Min: minScreenshotBytes, Max: max(l.MaxOutputBytes, minScreenshotBytes), Default: def},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "mime_type": catalog.OString(), "width": catalog.ONonNeg(), "height": catalog.ONonNeg(),
			"source_width": catalog.ONonNeg(), "source_height": catalog.ONonNeg(), "bytes": catalog.ONonNeg(),
		}, "vm", "mime_type", "width", "height", "source_width", "source_height", "bytes")},
	}, runScreenshot)
}

// screenshotArgs are vm_screenshot's arguments.
type screenshotArgs struct {
	MaxWidth int64 `arg:"max_width"` // 0: the display's size
	MaxBytes int64 `arg:"max_bytes"` // 0: the default
}

// CheckArgs: the request as the driver checks it (catalog.ArgChecker).
func (a *screenshotArgs) CheckArgs() error {
	return argError(hypervisor.ScreenshotRequest{MaxWidth: int(a.MaxWidth)}.Validate())
}

func runScreenshot(e *catalog.Env, c *catalog.Call, a *screenshotArgs) catalog.Result {
	sc, ok := hypervisor.AsScreener(c.Driver)
	if !ok {
		return lacks(c, "capture a VM's display")
	}
	limit := e.OutputCap(a.MaxBytes)
	if a.MaxBytes == 0 {
		limit = min(limit, defaultScreenshotBytes)
	}
	shot, err := sc.Screenshot(c.Ctx, c.Name, hypervisor.ScreenshotRequest{MaxWidth: int(a.MaxWidth)})
	if err != nil {
		return catalog.DriverFailure(err)
	}
	if int64(len(shot.PNG)) > limit {
		// One more try at the width whose PNG should fit (a PNG's size
		// goes with its area).
		w := int(float64(shot.Width) * math.Sqrt(float64(limit)/float64(len(shot.PNG))) * 0.9)
		if w < hypervisor.MinScreenshotWidth {
			return tooBig(shot, limit)
		}
		if shot, err = sc.Screenshot(c.Ctx, c.Name, hypervisor.ScreenshotRequest{MaxWidth: w}); err != nil {
			return catalog.DriverFailure(err)
		}
		if int64(len(shot.PNG)) > limit {
			return tooBig(shot, limit)
		}
	}
	out := map[string]any{"vm": c.VM, "mime_type": "image/png", "width": shot.Width, "height": shot.Height,
		"source_width": shot.SourceWidth, "source_height": shot.SourceHeight, "bytes": len(shot.PNG)}
	text := fmt.Sprintf("%s: screenshot %d×%d PNG, %d bytes", c.VM, shot.Width, shot.Height, len(shot.PNG))
	if shot.Width != shot.SourceWidth {
		text += fmt.Sprintf(" (the display is %d×%d)", shot.SourceWidth, shot.SourceHeight)
	}
	r := catalog.Success(out, text)
	r.Content = []mcp.Content{mcp.NewImageContent(base64.StdEncoding.EncodeToString(shot.PNG), "image/png")}
	return r
}

func tooBig(shot hypervisor.Screenshot, limit int64) catalog.Result {
	return catalog.Failure(catalog.TagBackend, fmt.Sprintf("the screenshot is %d bytes at %d×%d, over max_bytes %d even scaled down; ask with a smaller max_width or a larger max_bytes",
		len(shot.PNG), shot.Width, shot.Height, limit), true)
}

// lacks is the result for a backend without the capability the tool
// needs.
func lacks(c *catalog.Call, what string) catalog.Result {
	return catalog.Failure(catalog.TagBackend, fmt.Sprintf("backend %q cannot %s (its driver lacks the capability; README's Backends says what each needs)", c.Backend, what), true)
}

// argError is a request's Validate error as the agent reads it: the
// driver package's prefix and sentinel left out.
func argError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, p := range []string{"screenshot: ", "keys: ", "console read: ", "console write: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	msg = strings.Replace(msg, hypervisor.ErrInvalidArgument.Error()+": ", "", 1)
	return errors.New(msg)
}

func sendKeysTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_send_keys", Title: "Press keys on a VM", Destructive: true, OpenWorld: true,
		Desc: "Press key combinations on a VM's keyboard (keys: [\"ctrl-alt-delete\"], [\"alt-f2\"], [\"enter\"]; names as QEMU's: ctrl alt shift " +
			"delete ret spc esc tab backspace f1..f12 a..z 0..9 up down left right pgup pgdn home end), or type text through a keymap (US). " +
			"Through the hypervisor, without the guest agent. Text is typed key by key: \\n is Enter, \\t is Tab; other control characters " +
			"and characters the keymap cannot type are refused before any key is pressed. The audit log keeps the text only as its SHA-256 and length.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "keys", Kind: catalog.KindStringArray, Desc: "Key combinations pressed one after another, keys of one joined by \"-\" (\"ctrl-alt-delete\").",
				MaxLen: hypervisor.MaxKeyCombos, Valid: validCombo},
			{Name: "text", Kind: catalog.KindString, Desc: fmt.Sprintf("Text to type, at most %d characters.", hypervisor.MaxTypedText),
				MaxLen: 4 * hypervisor.MaxTypedText},
			{Name: "keymap", Kind: catalog.KindString, Desc: "Keyboard layout text is typed with (default us); only with text.", Enum: []string{hypervisor.DefaultKeymap}},
		},
		ExactlyOne: [][]string{{"keys", "text"}},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "presses": catalog.ONonNeg(),
		}, "vm", "presses")},
	}, runSendKeys)
}

// validCombo checks one key combination as the catalogue's validator
// meets it, so a bad name is refused naming it.
func validCombo(s string) error {
	_, err := hypervisor.ParseKeyCombo(s)
	return argError(err)
}

// sendKeysArgs are vm_send_keys' arguments.
type sendKeysArgs struct {
	Keys   []string `arg:"keys"`
	Text   *string  `arg:"text"`
	Keymap *string  `arg:"keymap"`
}

// request is a as the driver takes it.
func (a *sendKeysArgs) request() (hypervisor.KeysRequest, error) {
	var req hypervisor.KeysRequest
	for _, k := range a.Keys {
		combo, err := hypervisor.ParseKeyCombo(k)
		if err != nil {
			return req, err
		}
		req.Combos = append(req.Combos, combo)
	}
	if a.Text != nil {
		req.Text = *a.Text
	}
	if a.Keymap != nil {
		req.Keymap = *a.Keymap
	}
	return req, nil
}

// presses is how many key combinations a presses (0 when it is no good).
func (a *sendKeysArgs) presses() int {
	req, err := a.request()
	if err != nil {
		return 0
	}
	p, err := req.Presses()
	if err != nil {
		return 0
	}
	return len(p)
}

// CheckArgs: every key name known, every character typable by the
// keymap, before the policy decides (catalog.ArgChecker).
func (a *sendKeysArgs) CheckArgs() error {
	req, err := a.request()
	if err == nil {
		err = req.Validate()
	}
	return argError(err)
}

// Deadline: the call's timeout plus the time the typing takes
// (catalog.Deadliner).
func (a *sendKeysArgs) Deadline(e *catalog.Env) time.Duration {
	return e.Timeouts.Call + time.Duration(a.presses())*keyPressTime
}

func runSendKeys(e *catalog.Env, c *catalog.Call, a *sendKeysArgs) catalog.Result {
	ks, ok := hypervisor.AsKeySender(c.Driver)
	if !ok {
		return lacks(c, "press keys on a VM")
	}
	req, err := a.request()
	if err != nil {
		return catalog.Failure(catalog.TagInvalid, argError(err).Error(), true)
	}
	if err := ks.SendKeys(c.Ctx, c.Name, req); err != nil {
		return catalog.DriverFailure(err)
	}
	n := a.presses()
	what := fmt.Sprintf("%d key combination(s)", n)
	if req.Text != "" {
		what = fmt.Sprintf("%d character(s) of text", n)
	}
	return catalog.Success(map[string]any{"vm": c.VM, "presses": n}, fmt.Sprintf("%s: pressed %s", c.VM, what))
}
