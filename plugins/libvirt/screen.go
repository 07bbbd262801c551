package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/keypace"
)

// The screen and the keyboard through libvirt, not the guest agent:
//
//   - Screenshot: virDomainScreenshot, a stream of the image in the format
//     the hypervisor driver chose (libvirt's QEMU driver: PPM, or PNG
//     where QEMU and libvirt agree on it), made a PNG and scaled here.
//   - SendKeys: virDomainSendKey with the Linux key codes, one call per
//     combination (libvirt's QEMU driver sends each as a QMP send-key,
//     so it is paced as QEMU presses keys: plugins/internal/keypace).

var (
	_ hypervisor.Screener  = (*Driver)(nil)
	_ hypervisor.KeySender = (*Driver)(nil)
)

// screenConn is what the screen and keyboard need of a libvirt
// connection; *golibvirt.Libvirt implements it.
type screenConn interface {
	DomainScreenshot(dom golibvirt.Domain, inStream io.Writer, screen uint32, flags uint32) (golibvirt.OptString, error)
	DomainSendKey(dom golibvirt.Domain, codeset uint32, holdtime uint32, keycodes []uint32, flags uint32) error
}

var _ screenConn = (*golibvirt.Libvirt)(nil)

// maxScreenBytes bounds the image a screenshot stream may carry.
const maxScreenBytes = 64 << 20

// errTooLarge: the stream carried more than its bound.
var errTooLarge = errors.New("more than the bound")

// boundedBuffer is a bytes.Buffer that refuses to grow past max and
// counts what it was given, which another goroutine may read (written).
type boundedBuffer struct {
	bytes.Buffer
	max     int
	written atomic.Int64
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, errTooLarge
	}
	b.written.Add(int64(len(p)))
	return b.Buffer.Write(p)
}

func asScreenConn(c conn) (screenConn, error) {
	sc, ok := c.(screenConn)
	if !ok {
		return nil, fmt.Errorf("this connection has no screenshots or key input")
	}
	return sc, nil
}

// Screenshot captures the domain's first screen as a PNG.
func (d *Driver) Screenshot(ctx context.Context, name string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.Screenshot{}, fmt.Errorf("libvirt: %w", err)
	}
	s, err := d.lookup(ctx, "screenshot", name)
	if err != nil {
		return hypervisor.Screenshot{}, err
	}
	// go-libvirt loses a screenshot stream's end now and then: the image
	// comes short, or not at all, with the return value undecodable, or
	// the call never returns. A stream that does not decode, or that
	// brings nothing for screenshotStall, is taken again, a few times.
	var last error
	for range screenshotTries {
		mime, img, err := d.screenshotStream(ctx, s.handle(), screenshotStall)
		if errors.Is(err, errStreamStalled) && ctx.Err() == nil {
			last = err
			d.log.Debug("screenshot stream stalled; taking it again", "domain", name, "err", err)
			continue
		}
		if err != nil {
			return hypervisor.Screenshot{}, screenshotError(err)
		}
		shot, err := decodeScreenshot(mime, img, req.MaxWidth)
		if err == nil || ctx.Err() != nil {
			return shot, err
		}
		last = err
		d.log.Debug("screenshot stream incomplete; taking it again", "domain", name, "bytes", len(img), "err", err)
	}
	return hypervisor.Screenshot{}, last
}

// screenshotTries bounds the screenshots taken for one Screenshot.
const screenshotTries = 4

// screenshotStall is how long a screenshot stream may bring no byte, from
// its call or its last byte, before its connection is closed and it is
// taken again. A screen's image is a few MiB at most over a local
// socket; a guest starved of CPU slows QEMU's screendump, not libvirt's
// stream, so a stall this long is go-libvirt's lost end.
const screenshotStall = 15 * time.Second

// errStreamStalled: a screenshot stream brought nothing for its stall
// limit; its connection was closed.
var errStreamStalled = errors.New("the screenshot stream stalled")

// screenshotStream reads one virDomainScreenshot stream on a connection
// of its own (go-libvirt leaves a stream it has read half closed on its
// connection, and the next screenshot stream there came short): the
// image's MIME type (sniffed when go-libvirt cannot decode it) and bytes.
// A stream that brings no byte for stall is ended by closing its
// connection (errStreamStalled); so is one whose ctx ends. The goroutine
// that reads the stream owns nothing else and ends once the connection
// is closed.
func (d *Driver) screenshotStream(ctx context.Context, h golibvirt.Domain, stall time.Duration) (string, []byte, error) {
	c, err := d.dialConsole()
	if err != nil {
		return "", nil, fmt.Errorf("connection to libvirtd failed: %w", err)
	}
	var closeOnce sync.Once
	disconnect := func() { closeOnce.Do(func() { c.Disconnect() }) }
	defer disconnect()
	sc, ok := c.(screenConn)
	if !ok {
		return "", nil, errors.New("this connection has no screenshots")
	}
	img := &boundedBuffer{max: maxScreenBytes}
	res := make(chan streamResult, 1)
	go func() {
		m, err := sc.DomainScreenshot(h, img, 0, 0)
		mime := ""
		if len(m) > 0 {
			mime = m[0]
		}
		if err != nil && strings.HasPrefix(err.Error(), "xdr:") {
			// go-libvirt decodes the call's return value (the MIME type)
			// from the stream's last packet, which has none (rpc.go
			// requestStream returns processIncomingStream's response):
			// the image is sniffed instead, and checked by decoding it.
			err = nil
		}
		res <- streamResult{mime, err}
	}()
	return waitScreenshot(ctx, res, img, stall, disconnect)
}

// streamResult is what a screenshot stream's call returned.
type streamResult struct {
	mime string
	err  error
}

// waitScreenshot waits for a screenshot stream's call to return, checking
// its bytes as they come: it closes the stream's connection (disconnect)
// when ctx ends or when img grows by nothing for stall.
func waitScreenshot(ctx context.Context, res <-chan streamResult, img *boundedBuffer, stall time.Duration, disconnect func()) (string, []byte, error) {
	tick := time.NewTicker(stall / 10)
	defer tick.Stop()
	seen, since := img.written.Load(), time.Now()
	for {
		select {
		case r := <-res:
			mime := r.mime
			if mime == "" {
				mime = sniffImage(img.Bytes())
			}
			return mime, img.Bytes(), r.err
		case <-ctx.Done():
			disconnect()
			return "", nil, fmt.Errorf("%w: %w", hypervisor.ErrTimeout, ctx.Err())
		case now := <-tick.C:
			if n := img.written.Load(); n != seen {
				seen, since = n, now
			} else if now.Sub(since) >= stall {
				// The call ends with its connection (or never: it owns
				// img, which nothing here reads again).
				disconnect()
				return "", nil, fmt.Errorf("%w: no byte for %s after %d bytes", errStreamStalled, stall, n)
			}
		}
	}
}

// screenshotError says what a domain without a screen lacks.
func screenshotError(err error) error {
	if isLibvirtError(err) && strings.Contains(err.Error(), "no screens") {
		return fmt.Errorf("libvirt: screenshot: %w: the domain has no video device (libvirt said %q): add <video><model type='vga'/></video> to its XML",
			hypervisor.ErrNotSupported, err.Error())
	}
	return opError("screenshot", err)
}

// decodeScreenshot makes a Screenshot of the stream's image.
func decodeScreenshot(mime string, b []byte, maxWidth int) (hypervisor.Screenshot, error) {
	switch mime {
	case "image/png":
		// Decoded whole: a stream that came short shows here.
		if _, err := hypervisor.ScreenshotFromPNG(b, 0); err != nil {
			return hypervisor.Screenshot{}, fmt.Errorf("libvirt: %w", err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			return hypervisor.Screenshot{}, fmt.Errorf("libvirt: screenshot: PNG: %w", err)
		}
		if w := img.Bounds().Dx(); maxWidth == 0 || w <= maxWidth {
			return hypervisor.Screenshot{PNG: b, Width: w, Height: img.Bounds().Dy(), SourceWidth: w, SourceHeight: img.Bounds().Dy()}, nil
		}
		shot, err := hypervisor.NewScreenshot(img, maxWidth)
		if err != nil {
			return hypervisor.Screenshot{}, fmt.Errorf("libvirt: %w", err)
		}
		return shot, nil
	case "image/x-portable-pixmap":
		img, err := hypervisor.DecodePPM(bytes.NewReader(b))
		if err != nil {
			return hypervisor.Screenshot{}, fmt.Errorf("libvirt: screenshot: %w", err)
		}
		shot, err := hypervisor.NewScreenshot(img, maxWidth)
		if err != nil {
			return hypervisor.Screenshot{}, fmt.Errorf("libvirt: %w", err)
		}
		return shot, nil
	}
	return hypervisor.Screenshot{}, fmt.Errorf("libvirt: screenshot: %w: libvirt sent an image of type %q; the driver reads PNG and PPM", hypervisor.ErrBackend, mime)
}

// SendKeys presses req's keys on the domain's keyboard.
func (d *Driver) SendKeys(ctx context.Context, name string, req hypervisor.KeysRequest) error {
	presses, err := req.Presses()
	if err != nil {
		return fmt.Errorf("libvirt: %w", err)
	}
	s, err := d.lookup(ctx, "send keys", name)
	if err != nil {
		return err
	}
	h := s.handle()
	var pace keypace.Pacer
	for _, combo := range presses {
		if err := pace.Before(ctx, len(combo)); err != nil {
			return opError("send keys", err)
		}
		codes := make([]uint32, len(combo))
		for i, k := range combo {
			codes[i] = uint32(k.Linux())
		}
		err := d.call(ctx, false, func(c conn) error {
			sc, err := asScreenConn(c)
			if err != nil {
				return err
			}
			return sc.DomainSendKey(h, uint32(golibvirt.KeycodeSetLinux), 0, codes, 0)
		})
		if err != nil {
			return opError("send keys", err)
		}
	}
	if err := pace.Drain(ctx); err != nil {
		return opError("send keys", err)
	}
	return nil
}

// sniffImage names the type of a screenshot stream's image by its magic.
func sniffImage(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(b, []byte("P6")):
		return "image/x-portable-pixmap"
	}
	return "unknown"
}
