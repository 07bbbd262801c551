package hypervisor_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// screenFake has the screen, keyboard and console capabilities, answering
// fixed values and recording what reached it.
func screenFake(got *[]string) *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ScreenshotFunc: func(_ context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
			*got = append(*got, "screenshot "+vm)
			if req.MaxWidth == 32 {
				return hypervisor.Screenshot{}, errors.New("no display: add a video device")
			}
			return hypervisor.Screenshot{PNG: []byte("\x89PNG fake"), Width: req.MaxWidth, Height: 9, SourceWidth: 720, SourceHeight: 400}, nil
		},
		SendKeysFunc: func(_ context.Context, vm string, req hypervisor.KeysRequest) error {
			p, err := req.Presses()
			if err != nil {
				return err
			}
			*got = append(*got, "keys "+vm+" "+req.Keymap+" "+p[len(p)-1].String())
			return nil
		},
		ConsoleReadFunc: func(_ context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
			*got = append(*got, "console read "+vm)
			return hypervisor.ConsoleChunk{Data: []byte("Linux version\x00\xff"), Start: req.Since, Cursor: req.Since + 15, Dropped: 3, More: true, Reset: true}, nil
		},
		ConsoleWriteFunc: func(_ context.Context, vm string, data []byte) error {
			*got = append(*got, "console write "+vm+" "+string(data))
			return nil
		},
	}
}

func TestScreenCapabilitiesCrossTheBoundary(t *testing.T) {
	for _, transport := range []string{"grpc", "call socket"} {
		t.Run(transport, func(t *testing.T) {
			ctx := context.Background()
			var got []string
			var drv hypervisor.Driver
			if transport == "grpc" {
				drv = connect(t, "fake", screenFake(&got))
			} else {
				drv = callSocketDriver(t, screenFake(&got))
			}
			if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
				t.Fatalf("Configure() = %v", err)
			}
			want := hypervisor.Capabilities{Screenshot: true, SendKeys: true, ConsoleRead: true, ConsoleWrite: true}
			if k := hypervisor.CapabilitiesOf(drv); k != want {
				t.Fatalf("CapabilitiesOf(plugin client) = %+v; want %+v", k, want)
			}
			sc, _ := hypervisor.AsScreener(drv)
			shot, err := sc.Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{MaxWidth: 640})
			if err != nil || string(shot.PNG) != "\x89PNG fake" || shot.Width != 640 || shot.Height != 9 || shot.SourceWidth != 720 || shot.SourceHeight != 400 {
				t.Errorf("Screenshot() = %+v, %v; want the fake's", shot, err)
			}
			if _, err := sc.Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{MaxWidth: 32}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("add a video device")) {
				t.Errorf("Screenshot() of a VM without display = %v; want the driver's reason", err)
			}
			ks, _ := hypervisor.AsKeySender(drv)
			if err := ks.SendKeys(ctx, "vm1", hypervisor.KeysRequest{Combos: combos(t, "alt-f2", "ctrl-alt-delete")}); err != nil {
				t.Errorf("SendKeys(combos) = %v", err)
			}
			if err := ks.SendKeys(ctx, "vm1", hypervisor.KeysRequest{Text: "Hi", Keymap: "us"}); err != nil {
				t.Errorf("SendKeys(text) = %v", err)
			}
			cr, _ := hypervisor.AsConsoleReader(drv)
			c, err := cr.ConsoleRead(ctx, "vm1", hypervisor.ConsoleReadRequest{Since: 100})
			wantC := hypervisor.ConsoleChunk{Data: []byte("Linux version\x00\xff"), Start: 100, Cursor: 115, Dropped: 3, More: true, Reset: true}
			if err != nil || !reflect.DeepEqual(c, wantC) {
				t.Errorf("ConsoleRead() = %+v, %v; want %+v (binary data intact)", c, err, wantC)
			}
			cw, _ := hypervisor.AsConsoleWriter(drv)
			if err := cw.ConsoleWrite(ctx, "vm1", []byte("uname -r\n")); err != nil {
				t.Errorf("ConsoleWrite() = %v", err)
			}
			wantCalls := []string{"screenshot vm1", "screenshot vm1", "keys vm1  ctrl-alt-delete", "keys vm1 us i", "console read vm1", "console write vm1 uname -r\n"}
			if !reflect.DeepEqual(got, wantCalls) {
				t.Errorf("the plugin's driver saw %q; want %q", got, wantCalls)
			}
		})
	}
}

// callSocketDriver serves f on a call socket and returns the host's client.
func callSocketDriver(t *testing.T, f hypervisor.Driver) hypervisor.Driver {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stop, err := hypervisor.ServeCallSocket(dir, f, os.Geteuid())
	if err != nil {
		t.Fatalf("ServeCallSocket() = %v", err)
	}
	t.Cleanup(func() { stop() })
	drv, closeConns, err := hypervisor.DialCallSocket(context.Background(), "fake", dir)
	if err != nil {
		t.Fatalf("DialCallSocket() = %v", err)
	}
	t.Cleanup(func() { closeConns() })
	return drv
}

// TestScreenRequestsCheckedBeforeThePlugin: a bad request is refused on
// the host side; nothing reaches the plugin's driver.
func TestScreenRequestsCheckedBeforeThePlugin(t *testing.T) {
	ctx := context.Background()
	var calls atomic.Int32
	var got []string
	f := screenFake(&got)
	count := func(d *hypervisortest.Fake) {
		sf, kf, rf, wf := d.ScreenshotFunc, d.SendKeysFunc, d.ConsoleReadFunc, d.ConsoleWriteFunc
		d.ScreenshotFunc = func(ctx context.Context, vm string, r hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
			calls.Add(1)
			return sf(ctx, vm, r)
		}
		d.SendKeysFunc = func(ctx context.Context, vm string, r hypervisor.KeysRequest) error {
			calls.Add(1)
			return kf(ctx, vm, r)
		}
		d.ConsoleReadFunc = func(ctx context.Context, vm string, r hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
			calls.Add(1)
			return rf(ctx, vm, r)
		}
		d.ConsoleWriteFunc = func(ctx context.Context, vm string, b []byte) error { calls.Add(1); return wf(ctx, vm, b) }
	}
	count(f)
	drv := connect(t, "fake", f)
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatal(err)
	}
	errs := []error{
		drv.(hypervisor.KeySender).SendKeys(ctx, "vm1", hypervisor.KeysRequest{Text: "rm -rf /\x1b"}),
		drv.(hypervisor.KeySender).SendKeys(ctx, "vm1", hypervisor.KeysRequest{Combos: []hypervisor.KeyCombo{{"ctrl", "bogus"}}}),
		drv.(hypervisor.ConsoleWriter).ConsoleWrite(ctx, "vm1", nil),
	}
	_, err := drv.(hypervisor.Screener).Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{MaxWidth: -5})
	errs = append(errs, err)
	_, err = drv.(hypervisor.ConsoleReader).ConsoleRead(ctx, "vm1", hypervisor.ConsoleReadRequest{Since: -1})
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("bad request %d = %v; want ErrInvalidArgument", i, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the plugin's driver was called %d times for bad requests; want 0", n)
	}
}

func TestScreenCapabilitiesAbsent(t *testing.T) {
	ctx := context.Background()
	drv := connect(t, "plain", &hypervisortest.Fake{})
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for name, ok := range map[string]bool{
		"AsScreener":      func() bool { _, ok := hypervisor.AsScreener(drv); return ok }(),
		"AsKeySender":     func() bool { _, ok := hypervisor.AsKeySender(drv); return ok }(),
		"AsConsoleReader": func() bool { _, ok := hypervisor.AsConsoleReader(drv); return ok }(),
		"AsConsoleWriter": func() bool { _, ok := hypervisor.AsConsoleWriter(drv); return ok }(),
	} {
		if ok {
			t.Errorf("%s(plugin without the capability) ok = true; want false", name)
		}
	}
	_, err := drv.(hypervisor.Screener).Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{})
	if !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("Screenshot() on a plugin without it = %v; want ErrNotSupported", err)
	}
	err = drv.(hypervisor.ConsoleWriter).ConsoleWrite(ctx, "vm1", []byte("x"))
	if !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("ConsoleWrite() on a plugin without it = %v; want ErrNotSupported", err)
	}

	// Deferred: before Configure, not configured; after, the built
	// driver's capabilities, and ErrNotSupported for what it lacks.
	var got []string
	half := screenFake(&got)
	half.ConsoleWriteFunc = nil
	d := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return half, nil })
	if _, err := d.Screenshot(ctx, "vm1", hypervisor.ScreenshotRequest{}); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("Deferred.Screenshot() before Configure = %v; want ErrNotConfigured", err)
	}
	pd := connect(t, "deferred", d)
	if err := pd.(hypervisor.Configurer).Configure(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	want := hypervisor.Capabilities{Screenshot: true, SendKeys: true, ConsoleRead: true}
	if k := hypervisor.CapabilitiesOf(pd); k != want {
		t.Errorf("CapabilitiesOf(plugin serving a Deferred) = %+v; want %+v", k, want)
	}
	if err := pd.(hypervisor.KeySender).SendKeys(ctx, "vm1", hypervisor.KeysRequest{Text: "ok"}); err != nil {
		t.Errorf("SendKeys() through Deferred = %v", err)
	}
	if err := d.ConsoleWrite(ctx, "vm1", []byte("x")); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("Deferred.ConsoleWrite() without the capability = %v; want ErrNotSupported", err)
	}
}
