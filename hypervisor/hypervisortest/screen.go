package hypervisortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// The checks of the screen, keyboard and console capabilities (Run's
// Screen group, for the capabilities Harness.Capabilities declares), and
// RunConsoleBoot and RunWithoutAgent for a VM the calling test owns.
//
// They assume the lab guest's setup (guest/image): a shell on the first
// virtual terminal, shown on the display, and a shell on the serial
// console, which is also the kernel's console (/dev/console). A marker the
// checks need on the console is echoed to /dev/console through exec.

func hasScreenshot(k hypervisor.Capabilities) bool   { return k.Screenshot }
func hasSendKeys(k hypervisor.Capabilities) bool     { return k.SendKeys }
func hasConsoleRead(k hypervisor.Capabilities) bool  { return k.ConsoleRead }
func hasConsoleWrite(k hypervisor.Capabilities) bool { return k.ConsoleWrite }

// screenChecks are Run's Screen group: each runs only when the harness
// declares its capability (the rest of the group is the declaration check).
var screenChecks = []struct {
	check
	has func(hypervisor.Capabilities) bool
}{
	{check{"Screenshot", checkScreenshot}, hasScreenshot},
	{check{"ScreenshotMaxWidth", checkScreenshotMaxWidth}, hasScreenshot},
	{check{"KeysRefused", checkKeysRefused}, hasSendKeys},
	{check{"TypedTextOnScreen", checkTypedTextOnScreen}, func(k hypervisor.Capabilities) bool { return k.SendKeys && k.Screenshot }},
	{check{"ConsoleRead", checkConsoleRead}, hasConsoleRead},
	{check{"ConsoleWrite", checkConsoleWrite}, func(k hypervisor.Capabilities) bool { return k.ConsoleRead && k.ConsoleWrite }},
	{check{"UnknownVM", checkScreenUnknownVM}, anyScreenCap},
}

func anyScreenCap(k hypervisor.Capabilities) bool {
	return k.Screenshot || k.SendKeys || k.ConsoleRead || k.ConsoleWrite
}

// runScreenGroup runs the Screen checks h's declared capabilities call for.
func runScreenGroup(t *testing.T, h Harness) {
	for _, c := range screenChecks {
		if c.has(h.Capabilities) {
			t.Run(c.name, func(t *testing.T) { c.run(t, h) })
		}
	}
}

func screenshot(t testing.TB, h Harness, ctx context.Context, maxWidth int) hypervisor.Screenshot {
	t.Helper()
	sc, ok := hypervisor.AsScreener(h.Driver)
	if !ok {
		t.Fatalf("the driver is no Screener; the harness declares screenshots")
	}
	shot, err := sc.Screenshot(ctx, h.VM, hypervisor.ScreenshotRequest{MaxWidth: maxWidth})
	if err != nil {
		t.Fatalf("Screenshot(%q, max width %d) error: %v", h.VM, maxWidth, err)
	}
	img, err := png.Decode(bytes.NewReader(shot.PNG))
	if err != nil {
		t.Fatalf("Screenshot(%q, max width %d): %d bytes that are no PNG: %v", h.VM, maxWidth, len(shot.PNG), err)
	}
	if b := img.Bounds(); b.Dx() != shot.Width || b.Dy() != shot.Height {
		t.Errorf("Screenshot(%q) says %d×%d; its PNG is %d×%d", h.VM, shot.Width, shot.Height, b.Dx(), b.Dy())
	}
	return shot
}

func checkScreenshot(t testing.TB, h Harness) {
	shot := screenshot(t, h, h.ctx(t), 0)
	if shot.Width < 320 || shot.Height < 200 {
		t.Errorf("Screenshot(%q) = %d×%d; want at least 320×200 (an 80×25 text console is 720×400)", h.VM, shot.Width, shot.Height)
	}
	if shot.SourceWidth != shot.Width || shot.SourceHeight != shot.Height {
		t.Errorf("Screenshot(%q) unscaled is %d×%d from a %d×%d display; want the display's size", h.VM, shot.Width, shot.Height, shot.SourceWidth, shot.SourceHeight)
	}
	sc, _ := hypervisor.AsScreener(h.Driver)
	if _, err := sc.Screenshot(h.ctx(t), h.VM, hypervisor.ScreenshotRequest{MaxWidth: -1}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("Screenshot(%q, max width -1) = %v; want ErrInvalidArgument", h.VM, err)
	}
}

func checkScreenshotMaxWidth(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	full := screenshot(t, h, ctx, 0)
	for _, w := range []int{full.Width / 2, 200, full.Width, full.Width * 2} {
		shot := screenshot(t, h, ctx, w)
		wantW := min(w, full.SourceWidth)
		wantH := (full.SourceHeight*wantW + full.SourceWidth/2) / full.SourceWidth
		if shot.Width != wantW || shot.Height < wantH-1 || shot.Height > wantH+1 {
			t.Errorf("Screenshot(%q, max width %d) = %d×%d of %d×%d; want %d×%d (aspect kept, never enlarged)",
				h.VM, w, shot.Width, shot.Height, shot.SourceWidth, shot.SourceHeight, wantW, wantH)
		}
	}
}

func checkKeysRefused(t testing.TB, h Harness) {
	ks, _ := hypervisor.AsKeySender(h.Driver)
	for _, req := range []hypervisor.KeysRequest{
		{Text: "echo \x1b[2J"}, {Text: "caf\u00e9"}, {Combos: []hypervisor.KeyCombo{{"ctrl", "nope"}}}, {},
	} {
		if err := ks.SendKeys(h.ctx(t), h.VM, req); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("SendKeys(%q, %+q) = %v; want ErrInvalidArgument", h.VM, req, err)
		}
	}
}

// ocrLetters are letters OCR does not confuse with digits or each other
// on a VGA text console (no i, l, o; none of g q y u v w m n, which it
// reads as one another, or splits: "q" as "gq").
const ocrLetters = "abcdefhjkprstxz"

func ocrToken() string {
	b := []byte("vmgate")
	for range 7 {
		b = append(b, ocrLetters[mrand.IntN(len(ocrLetters))])
	}
	return string(b)
}

// checkTypedTextOnScreen types a command on the VM's first virtual
// terminal and reads it back from the screen by OCR: the keys reached the
// guest, and the screenshot is the guest's own display, legible.
func checkTypedTextOnScreen(t testing.TB, h Harness) {
	token := ocrToken()
	typeAndSee(t, h, token)
}

// typeAndSee types "echo <token>" and Enter, then waits until OCR finds
// the token on the screen.
func typeAndSee(t testing.TB, h Harness, token string) {
	t.Helper()
	ks, _ := hypervisor.AsKeySender(h.Driver)
	if err := ks.SendKeys(h.ctx(t), h.VM, hypervisor.KeysRequest{Text: "echo " + token + "\n"}); err != nil {
		t.Fatalf("SendKeys(%q, text) error: %v", h.VM, err)
	}
	ctx := h.ctx(t)
	var seen string
	var last []byte
	var b hypervisor.Backoff
	for {
		shot := screenshot(t, h, ctx, 0)
		text, err := OCR(ctx, shot.PNG)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("OCR of the screenshot: %v", err)
		}
		if err == nil && ocrFound(text, token) {
			return
		}
		if err == nil {
			seen, last = text, shot.PNG
		}
		if ctx.Err() != nil || b.Sleep(ctx, 2*time.Second) != nil {
			t.Fatalf("typed %q on %s; OCR of the screen never showed it; last read:\n%s%s", token, h.VM, seen, keepScreenshot(t, last))
		}
	}
}

// ocrFound reports whether text (OCR's reading of a screen) holds token,
// allowing OCR two misread letters (on a VGA console it reads "w" as "y",
// "m" as "n", "q" as "gq" now and then): some stretch of a line, spaces
// left out, within an edit distance of two of token (a letter changed,
// added or dropped). A random 13-letter token is that close to nothing
// else on the screen by chance.
func ocrFound(text, token string) bool {
	for _, line := range strings.Split(strings.ToLower(text), "\n") {
		if nearSubstring(strings.ReplaceAll(line, " ", ""), token, 2) {
			return true
		}
	}
	return false
}

// nearSubstring reports whether some substring of s is within edit
// distance k of t (Sellers' algorithm: a match may start anywhere in s).
func nearSubstring(s, t string, k int) bool {
	prev := make([]int, len(s)+1) // row 0: the empty prefix of t matches anywhere
	cur := make([]int, len(s)+1)
	for i := 1; i <= len(t); i++ {
		cur[0] = i
		for j := 1; j <= len(s); j++ {
			sub := prev[j-1]
			if t[i-1] != s[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return slices.Min(prev) <= k
}

// consoleMarker echoes marker to the guest's console through exec.
func consoleMarker(t testing.TB, h Harness, marker string) {
	t.Helper()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo " + marker + " >/dev/console"}}
	res := run(t, h, req)
	wantExit0(t, req, res)
}

// waitConsole reads vm's console from cursor until want appears, and
// returns everything read and the last cursor.
func waitConsole(t testing.TB, h Harness, ctx context.Context, cursor int64, want string) (string, int64) {
	t.Helper()
	cr, _ := hypervisor.AsConsoleReader(h.Driver)
	var got strings.Builder
	var b hypervisor.Backoff
	for {
		c, err := cr.ConsoleRead(ctx, h.VM, hypervisor.ConsoleReadRequest{Since: cursor})
		if err != nil {
			t.Fatalf("ConsoleRead(%q, since %d) error: %v", h.VM, cursor, err)
		}
		if !c.Reset && (c.Start != cursor+c.Dropped || c.Cursor != c.Start+int64(len(c.Data))) {
			t.Fatalf("ConsoleRead(%q, since %d) = start %d, %d bytes, cursor %d, dropped %d; want start = since + dropped, cursor = start + len(data)",
				h.VM, cursor, c.Start, len(c.Data), c.Cursor, c.Dropped)
		}
		got.Write(c.Data)
		cursor = c.Cursor
		if strings.Contains(got.String(), want) {
			return got.String(), cursor
		}
		if c.More {
			continue
		}
		if b.Sleep(ctx, time.Second) != nil {
			t.Fatalf("ConsoleRead(%q) never showed %q; read %d bytes: %q", h.VM, want, got.Len(), tailString(got.String(), 600))
		}
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// consoleCursor returns the console's current end (reading its tail).
func consoleCursor(t testing.TB, h Harness, ctx context.Context) int64 {
	t.Helper()
	cr, _ := hypervisor.AsConsoleReader(h.Driver)
	c, err := cr.ConsoleRead(ctx, h.VM, hypervisor.ConsoleReadRequest{TailBytes: 1})
	if err != nil {
		t.Fatalf("ConsoleRead(%q, tail 1) error: %v", h.VM, err)
	}
	if len(c.Data) > 1 || c.Cursor != c.Start+int64(len(c.Data)) {
		t.Fatalf("ConsoleRead(%q, tail 1) = %d bytes from %d, cursor %d; want at most 1 byte ending at the cursor", h.VM, len(c.Data), c.Start, c.Cursor)
	}
	return c.Cursor
}

func checkConsoleRead(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	cursor := consoleCursor(t, h, ctx)
	marker := "vmgate-console-" + randHex(t)
	consoleMarker(t, h, marker)
	_, end := waitConsole(t, h, ctx, cursor, marker)
	// The tail ends where the stream does (the guest may have written
	// more since); while nothing came after the marker, it holds it.
	cr, _ := hypervisor.AsConsoleReader(h.Driver)
	n := int(end - cursor)
	c, err := cr.ConsoleRead(ctx, h.VM, hypervisor.ConsoleReadRequest{TailBytes: n})
	if err != nil {
		t.Fatalf("ConsoleRead(%q, tail %d) error: %v", h.VM, n, err)
	}
	if len(c.Data) > n || c.Cursor < end || c.Cursor != c.Start+int64(len(c.Data)) {
		t.Errorf("ConsoleRead(%q, tail %d) = %d bytes from %d, cursor %d; want at most %d bytes ending at the stream's end (at or after %d)",
			h.VM, n, len(c.Data), c.Start, c.Cursor, n, end)
	}
	if c.Cursor == end && !strings.Contains(string(c.Data), marker) {
		t.Errorf("ConsoleRead(%q, tail %d) = %q; want the marker %q, the last output", h.VM, n, c.Data, marker)
	}
	// Reading from the end gives nothing new but the same cursor.
	c, err = cr.ConsoleRead(ctx, h.VM, hypervisor.ConsoleReadRequest{Since: c.Cursor})
	if err != nil || c.Cursor < end {
		t.Errorf("ConsoleRead(%q, since the end) = %+v, %v; want the cursor to stay", h.VM, c, err)
	}
	if _, err := cr.ConsoleRead(ctx, h.VM, hypervisor.ConsoleReadRequest{Since: -1}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("ConsoleRead(%q, since -1) = %v; want ErrInvalidArgument", h.VM, err)
	}
}

// checkConsoleWrite writes a command to the shell on the serial console
// and finds its output (not the echo of what was typed) in the next reads.
func checkConsoleWrite(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	consoleCommandOutput(t, h, ctx)
	cw, _ := hypervisor.AsConsoleWriter(h.Driver)
	if err := cw.ConsoleWrite(ctx, h.VM, nil); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("ConsoleWrite(%q, nothing) = %v; want ErrInvalidArgument", h.VM, err)
	}
}

// consoleCommandOutput runs an arithmetic echo at the serial shell: the
// output "<6*7>-<word>" appears only if the shell ran it.
func consoleCommandOutput(t testing.TB, h Harness, ctx context.Context) {
	t.Helper()
	cursor := consoleCursor(t, h, ctx)
	word := randHex(t)
	cw, _ := hypervisor.AsConsoleWriter(h.Driver)
	if err := cw.ConsoleWrite(ctx, h.VM, []byte("echo $((6*7))-"+word+"\n")); err != nil {
		t.Fatalf("ConsoleWrite(%q) error: %v", h.VM, err)
	}
	waitConsole(t, h, ctx, cursor, "42-"+word)
}

func checkScreenUnknownVM(t testing.TB, h Harness) {
	ctx := h.ctx(t)
	vm := h.unknownVM()
	errs := map[string]error{}
	add := func(name string, err error) { errs[name] = err }
	if s, ok := hypervisor.AsScreener(h.Driver); ok {
		_, err := s.Screenshot(ctx, vm, hypervisor.ScreenshotRequest{})
		add("Screenshot", err)
	}
	if k, ok := hypervisor.AsKeySender(h.Driver); ok {
		add("SendKeys", k.SendKeys(ctx, vm, hypervisor.KeysRequest{Text: "x"}))
	}
	if r, ok := hypervisor.AsConsoleReader(h.Driver); ok {
		_, err := r.ConsoleRead(ctx, vm, hypervisor.ConsoleReadRequest{})
		add("ConsoleRead", err)
	}
	if w, ok := hypervisor.AsConsoleWriter(h.Driver); ok {
		add("ConsoleWrite", w.ConsoleWrite(ctx, vm, []byte("x\n")))
	}
	for name, err := range errs {
		if !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("%s(%q) = %v; want ErrUnknownVM", name, vm, err)
		}
	}
}

// RunConsoleBoot checks that the serial console shows the guest's boot
// messages: it opens the console, resets h.VM (which the calling test
// must own) and waits for the kernel's banner ("Linux version") after the
// cursor, then for the guest agent to answer again. A driver whose
// console carries only what arrives while it is open (libvirt's and
// Proxmox's streams) sees the boot it was open for.
func RunConsoleBoot(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	requireCapability(t, h, "console read", hasConsoleRead)
	ctx, cancel := testload.WithTimeout(context.Background(), h.powerTimeout())
	defer cancel()
	before, err := bootID(h.ctx(t), h)
	if err != nil {
		t.Fatalf("boot id before reset: %v", err)
	}
	cursor := consoleCursor(t, h, ctx)
	if err := h.Driver.Power(h.ctx(t), h.VM, hypervisor.PowerReset); err != nil {
		t.Fatalf("Power(%q, reset) error: %v", h.VM, err)
	}
	got, _ := waitConsole(t, h, ctx, cursor, "Linux version")
	if !strings.Contains(got, "Linux version") {
		t.Fatalf("no kernel banner on the console after a reset")
	}
	upAgain(t, h, before)
}

// RunWithoutAgent checks that the screen, keyboard and console work while
// the guest agent does not answer: it stops the agent with h.StopAgent,
// waits until Status says so, runs the checks of the declared
// capabilities, and resumes the agent with h.ResumeAgent. h.VM must be
// the calling test's own.
func RunWithoutAgent(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	if h.StopAgent == nil || h.ResumeAgent == nil {
		t.Fatal("hypervisortest: RunWithoutAgent needs Harness.StopAgent and Harness.ResumeAgent")
	}
	if !anyScreenCap(h.Capabilities) {
		t.Fatal("hypervisortest: RunWithoutAgent: the harness declares none of the screen, keyboard and console capabilities")
	}
	h.StopAgent(t)
	t.Cleanup(func() { h.ResumeAgent(t) })
	waitFor(t, h, "the guest agent not answering", func(ctx context.Context) (bool, string) {
		st, err := h.Driver.Status(ctx, h.VM)
		if err != nil {
			return false, fmt.Sprintf("Status error %v", err)
		}
		return st.State == hypervisor.StateRunning && !st.AgentConnected, fmt.Sprintf("state %q, agent connected %v", st.State, st.AgentConnected)
	})
	k := h.Capabilities
	if k.Screenshot {
		t.Run("Screenshot", func(t *testing.T) { checkScreenshot(t, h) })
	}
	if k.SendKeys && k.Screenshot {
		t.Run("TypedTextOnScreen", func(t *testing.T) { checkTypedTextOnScreen(t, h) })
	}
	if k.ConsoleRead && k.ConsoleWrite {
		t.Run("ConsoleWriteRead", func(t *testing.T) { consoleCommandOutput(t, h, h.ctx(t)) })
	} else if k.ConsoleRead {
		t.Run("ConsoleRead", func(t *testing.T) { consoleCursor(t, h, h.ctx(t)) })
	}
}

// keepScreenshot saves a screenshot a check failed on where the run's
// artifacts go ($VMGATE_TEST_ARTIFACTS), and says where.
func keepScreenshot(t testing.TB, png []byte) string {
	dir := os.Getenv("VMGATE_TEST_ARTIFACTS")
	if dir == "" || len(png) == 0 {
		return ""
	}
	f, err := os.CreateTemp(dir, "screenshot-*.png")
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Write(png); err != nil {
		return ""
	}
	return "\n(the screenshot: " + f.Name() + ")"
}
