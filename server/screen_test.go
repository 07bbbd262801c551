package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/mcptest"
)

// pngOf is a w×h PNG: noise (which does not compress) or black.
func pngOf(t testing.TB, w, h int, noise bool) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, w, h))
	if noise {
		r := rand.New(rand.NewPCG(1, 2))
		for i := range img.Pix {
			img.Pix[i] = uint8(r.IntN(256))
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// screenFake is a driver with the screen, keys and console, recording
// what reached it.
type screenFake struct {
	mu      sync.Mutex
	shots   []hypervisor.ScreenshotRequest
	keys    []hypervisor.KeysRequest
	written []string
	reads   []hypervisor.ConsoleReadRequest
	console []byte // what ConsoleRead returns
}

func (s *screenFake) install(t testing.TB, f *fixture, noise bool) *hypervisortest.Fake {
	drv := hypervisortest.Counting(f.calls)
	drv.ScreenshotFunc = func(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
		s.mu.Lock()
		s.shots = append(s.shots, req)
		s.mu.Unlock()
		w := 720
		if req.MaxWidth > 0 {
			w = min(w, req.MaxWidth)
		}
		h := w * 400 / 720
		return hypervisor.Screenshot{PNG: pngOf(t, w, h, noise), Width: w, Height: h, SourceWidth: 720, SourceHeight: 400}, nil
	}
	drv.SendKeysFunc = func(ctx context.Context, vm string, req hypervisor.KeysRequest) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.keys = append(s.keys, req)
		return req.Validate()
	}
	drv.ConsoleReadFunc = func(ctx context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reads = append(s.reads, req)
		return hypervisor.ConsoleChunk{Data: s.console, Start: 100, Cursor: 100 + int64(len(s.console)), Dropped: 3}, nil
	}
	drv.ConsoleWriteFunc = func(ctx context.Context, vm string, data []byte) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.written = append(s.written, string(data))
		return nil
	}
	f.s.backends["lab"] = drv
	return drv
}

// TestScreenshotIsAnImage: vm_screenshot answers with the PNG as MCP image
// content and its size in structuredContent, and passes max_width on.
func TestScreenshotIsAnImage(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s screenFake
	s.install(t, f, false)
	r := f.call(t, "vm_screenshot", `{"vm":"lab/vm1","max_width":360}`)
	if r.Result == nil || r.Result.IsError || len(r.Result.Content) != 2 {
		t.Fatalf("vm_screenshot = %+v; want a text and an image", r.Result)
	}
	img := r.Result.Content[1]
	b, err := base64.StdEncoding.DecodeString(img.Data)
	if img.Type != "image" || img.MimeType != "image/png" || err != nil {
		t.Fatalf("vm_screenshot content[1] = %s %s (%v); want a base64 image/png", img.Type, img.MimeType, err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	sc := r.Result.StructuredContent
	if err != nil || cfg.Width != 360 || sc["width"] != 360.0 || sc["height"] != float64(cfg.Height) || sc["source_width"] != 720.0 || sc["bytes"] != float64(len(b)) {
		t.Errorf("vm_screenshot PNG %dx%d (%v), structuredContent %v; want 360 wide from 720, sizes matching", cfg.Width, cfg.Height, err, sc)
	}
	if len(s.shots) != 1 || s.shots[0].MaxWidth != 360 {
		t.Errorf("driver got %+v; want one screenshot with max width 360", s.shots)
	}
	for _, args := range []string{`{"vm":"lab/vm1","max_width":8}`, `{"vm":"lab/vm1","max_bytes":10}`, `{"vm":"lab/vm1","max_width":"big"}`} {
		if r := f.call(t, "vm_screenshot", args); !mcptest.HasTag(r, TagInvalid) {
			t.Errorf("vm_screenshot(%s) = %q; want %s", args, r.Text(), TagInvalid)
		}
	}
}

// TestScreenshotMaxBytes: a PNG over max_bytes is taken again narrower
// once; one that still does not fit is an error that says what to ask.
func TestScreenshotMaxBytes(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s screenFake
	drv := s.install(t, f, true) // noise: 720×400 is about 290 KB
	r := f.call(t, "vm_screenshot", `{"vm":"lab/vm1","max_bytes":100000}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_screenshot(max_bytes 100000) = %q; want a smaller screenshot", r.Text())
	}
	if n := r.Result.StructuredContent["bytes"].(float64); n > 100000 || len(s.shots) != 2 || s.shots[1].MaxWidth == 0 || s.shots[1].MaxWidth >= 720 {
		t.Errorf("vm_screenshot(max_bytes 100000) = %v bytes after %+v; want at most 100000 from a second, narrower screenshot", n, s.shots)
	}
	big := pngOf(t, 720, 400, true)
	drv.ScreenshotFunc = func(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
		return hypervisor.Screenshot{PNG: big, Width: 720, Height: 400, SourceWidth: 720, SourceHeight: 400}, nil // never smaller
	}
	r = f.call(t, "vm_screenshot", `{"vm":"lab/vm1","max_bytes":1024}`)
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), "max_bytes") || len(r.Result.Content) != 1 {
		t.Errorf("vm_screenshot(max_bytes 1024, a screen that does not shrink) = %q; want %s naming max_bytes, no image", r.Text(), TagBackend)
	}
}

// TestSendKeysChecksBeforeAnyKey: key names, text the keymap cannot type
// and keys with text are refused in the gate's validate step: nothing
// reaches the driver, no approval is parked; good calls reach it whole.
func TestSendKeysChecksBeforeAnyKey(t *testing.T) {
	f := newFixture(t, fixtureOpts{policy: `{"version":"1","default":"allow","tools":{"vm_send_keys":{"action":"approve"}}}`})
	var s screenFake
	s.install(t, f, false)
	for _, args := range []string{
		`{"vm":"lab/vm1","keys":["ctrl-alt-nope"]}`,
		`{"vm":"lab/vm1","keys":["ctrl--alt"]}`,
		`{"vm":"lab/vm1","keys":["ctrl-alt-delete\n"]}`,
		`{"vm":"lab/vm1","keys":["ｃｔｒｌ-c"]}`,
		`{"vm":"lab/vm1","keys":["ctrl-ctrl"]}`,
		`{"vm":"lab/vm1","keys":[]}`,
		`{"vm":"lab/vm1","text":"echo \u001b[2J"}`,
		`{"vm":"lab/vm1","text":"caf\u00e9"}`,
		`{"vm":"lab/vm1","text":"ls\r"}`,
		`{"vm":"lab/vm1","text":"\u202eevil"}`,
		`{"vm":"lab/vm1","text":""}`,
		`{"vm":"lab/vm1","text":"ls","keys":["enter"]}`,
		`{"vm":"lab/vm1","keys":["enter"],"keymap":"us"}`,
		`{"vm":"lab/vm1","text":"ls","keymap":"de"}`,
		`{"vm":"lab/vm1"}`,
	} {
		if r := f.call(t, "vm_send_keys", args); !mcptest.HasTag(r, TagInvalid) {
			t.Errorf("vm_send_keys(%s) = %q; want %s", args, r.Text(), TagInvalid)
		}
	}
	if list, _ := f.s.Approvals().List(context.Background()); len(list) != 0 || len(s.keys) != 0 {
		t.Fatalf("refused calls parked %d approvals and pressed %+v; want none", len(list), s.keys)
	}
	f2 := newFixture(t, fixtureOpts{})
	var s2 screenFake
	s2.install(t, f2, false)
	r := f2.call(t, "vm_send_keys", `{"vm":"lab/vm1","keys":["ctrl-alt-delete","Enter"]}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["presses"] != 2.0 {
		t.Fatalf("vm_send_keys(keys) = %q; want 2 presses", r.Text())
	}
	r = f2.call(t, "vm_send_keys", `{"vm":"lab/vm1","text":"Root!\n"}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["presses"] != 6.0 {
		t.Fatalf("vm_send_keys(text) = %q; want 6 presses", r.Text())
	}
	want := []string{`{"combos":[["ctrl","alt","delete"],["ret"]]}`, `{"text":"Root!\n"}`}
	for i, k := range s2.keys {
		if b, _ := json.Marshal(k); i >= len(want) || string(b) != want[i] {
			t.Errorf("driver got keys %s; want %s", b, want[min(i, len(want)-1)])
		}
	}
}

// TestTypedTextRedactedButShownToTheOperator: the text of vm_send_keys and
// vm_console_write is in the audit log only as its digest; the parked
// approval keeps it whole, and the operator's view shows it with hidden
// characters escaped. A policy condition sees the text.
func TestTypedTextRedactedButShownToTheOperator(t *testing.T) {
	pol := `{"version":"1","default":"allow","tools":{
		"vm_send_keys":{"action":"approve","deny_if":[{"path":"args.text","op":"contains","value":"reboot"}]},
		"vm_console_write":{"action":"approve"}}}`
	f := newFixture(t, fixtureOpts{policy: pol})
	var s screenFake
	s.install(t, f, false)
	const typed, written = "hunter2-secret-7f3a\n", "echo ok\u001b[1A\rrm -rf /tmp/x-secret-91bc\n"
	if r := f.call(t, "vm_send_keys", `{"vm":"lab/vm1","text":"sudo reboot\n"}`); !mcptest.HasTag(r, TagDenied) {
		t.Errorf("vm_send_keys(reboot) = %q; want %s by the condition on args.text", r.Text(), TagDenied)
	}
	views := map[string]string{}
	for tool, args := range map[string]map[string]any{
		"vm_send_keys": {"vm": "lab/vm1", "text": typed}, "vm_console_write": {"vm": "lab/vm1", "text": written},
	} {
		b, _ := json.Marshal(args)
		r := f.call(t, tool, string(b))
		if !mcptest.HasTag(r, TagApproval) {
			t.Fatalf("%s = %q; want %s", tool, r.Text(), TagApproval)
		}
		ap, err := f.s.Approvals().Get(context.Background(), r.Result.StructuredContent["approval_id"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(ap.Args, "secret") {
			t.Errorf("%s approval's redacted args %s hold the text", tool, ap.Args)
		}
		for _, fl := range View(ap, 0).Arguments {
			if fl.Name == "text" {
				views[tool] = fl.Value
			}
		}
	}
	if views["vm_send_keys"] != typed {
		t.Errorf("operator's view of the typed text = %q; want %q", views["vm_send_keys"], typed)
	}
	if want := `echo ok\x1b[1A\x0drm -rf /tmp/x-secret-91bc` + "\n"; views["vm_console_write"] != want {
		t.Errorf("operator's view of the console text = %q; want %q (escapes shown)", views["vm_console_write"], want)
	}
	var log bytes.Buffer
	if err := f.rec.Each(func(r audit.Record) error { b, _ := json.Marshal(r); log.Write(b); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "secret-") || !strings.Contains(log.String(), `"text":"sha256:`) {
		t.Errorf("audit records %s; want the text as its digest only", log.String())
	}
}

// TestConsoleTools: vm_console_read passes since, tail and size on and
// returns text or base64 with the offsets; vm_console_write sends the
// text whole; a backend without console input says so.
func TestConsoleTools(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s screenFake
	drv := s.install(t, f, false)
	s.console = []byte("Linux version 6.1\r\n")
	r := f.call(t, "vm_console_read", `{"vm":"lab/vm1","since":97}`)
	sc := r.Result.StructuredContent
	if r.Result.IsError || sc["data"] != string(s.console) || sc["start"] != 100.0 || sc["cursor"] != float64(100+len(s.console)) || sc["dropped"] != 3.0 ||
		!strings.Contains(r.Text(), "Linux version") {
		t.Errorf("vm_console_read = %q %v; want the text with its offsets", r.Text(), sc)
	}
	if len(s.reads) != 1 || s.reads[0].Since != 97 || s.reads[0].MaxBytes != 0 {
		t.Errorf("driver got %+v; want since 97 with the driver's default size", s.reads)
	}
	s.console = []byte{0xff, 0xfe, 'x'}
	r = f.call(t, "vm_console_read", `{"vm":"lab/vm1","tail_bytes":3}`)
	if sc := r.Result.StructuredContent; sc["data_base64"] != "//54" || sc["data"] != nil {
		t.Errorf("vm_console_read(not UTF-8) = %v; want data_base64 only", sc)
	}
	for _, args := range []string{`{"vm":"lab/vm1","since":5,"tail_bytes":3}`, `{"vm":"lab/vm1","since":-1}`, `{"vm":"lab/vm1","max_bytes":2000000}`} {
		if r := f.call(t, "vm_console_read", args); !mcptest.HasTag(r, TagInvalid) {
			t.Errorf("vm_console_read(%s) = %q; want %s", args, r.Text(), TagInvalid)
		}
	}
	r = f.call(t, "vm_console_write", `{"vm":"lab/vm1","text":"uname -a\n\u0003"}`)
	if r.Result.IsError || len(s.written) != 1 || s.written[0] != "uname -a\n\x03" || r.Result.StructuredContent["bytes"] != 10.0 {
		t.Errorf("vm_console_write = %q, driver got %q; want the text whole", r.Text(), s.written)
	}
	if r := f.call(t, "vm_console_write", `{"vm":"lab/vm1","text":""}`); !mcptest.HasTag(r, TagInvalid) {
		t.Errorf("vm_console_write(empty) = %q; want %s", r.Text(), TagInvalid)
	}
	drv.ConsoleWriteFunc = nil // as VirtualBox: no console input
	if r := f.call(t, "vm_console_write", `{"vm":"lab/vm1","text":"x\n"}`); !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), `backend "lab" cannot write`) {
		t.Errorf("vm_console_write on a backend without console input = %q; want %s naming the backend", r.Text(), TagBackend)
	}
}
