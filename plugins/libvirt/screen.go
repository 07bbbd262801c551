package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"strings"

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

// boundedBuffer is a bytes.Buffer that refuses to grow past max.
type boundedBuffer struct {
	bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, errTooLarge
	}
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
	// go-libvirt loses a screenshot stream's end now and then (the image
	// comes short, or not at all, with the return value undecodable):
	// an image that does not decode is taken again, a few times.
	var last error
	for range screenshotTries {
		mime, img, err := d.screenshotStream(ctx, s.handle())
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

// screenshotStream reads one virDomainScreenshot stream on a connection
// of its own (go-libvirt leaves a stream it has read half closed on its
// connection, and the next screenshot stream there came short): the
// image's MIME type (sniffed when go-libvirt cannot decode it) and bytes.
func (d *Driver) screenshotStream(ctx context.Context, h golibvirt.Domain) (string, []byte, error) {
	type result struct {
		mime string
		img  []byte
		err  error
	}
	res := make(chan result, 1)
	go func() {
		c, err := d.dialConsole()
		if err != nil {
			res <- result{err: fmt.Errorf("connection to libvirtd failed: %w", err)}
			return
		}
		defer c.Disconnect()
		sc, ok := c.(screenConn)
		if !ok {
			res <- result{err: errors.New("this connection has no screenshots")}
			return
		}
		img := boundedBuffer{max: maxScreenBytes}
		m, err := sc.DomainScreenshot(h, &img, 0, 0)
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
		if mime == "" {
			mime = sniffImage(img.Bytes())
		}
		res <- result{mime, img.Bytes(), err}
	}()
	select {
	case r := <-res:
		return r.mime, r.img, r.err
	case <-ctx.Done():
		return "", nil, fmt.Errorf("%w: %w", hypervisor.ErrTimeout, ctx.Err())
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
