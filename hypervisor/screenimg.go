package hypervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/draw"
	"image/png"
	"io"
	"strconv"
)

// The image side of Screener, shared by the drivers: a backend's capture
// (a PNG, a PPM, raw pixels) becomes a Screenshot, scaled down to the
// request's MaxWidth by area averaging, which keeps the strokes of an
// 80×25 text console legible where dropping pixels would lose them.

// MaxScreenPixels bounds the display a driver decodes (16384×16384
// would be 1 GiB of RGBA): an image whose header claims more is refused
// before its pixels are read.
const MaxScreenPixels = 8192 * 8192

// ScreenshotFromPNG makes a Screenshot of an encoded PNG. A PNG no wider
// than maxWidth (or any, with maxWidth 0) is returned as it is, after its
// header is read; a wider one is decoded, scaled and encoded again.
func ScreenshotFromPNG(b []byte, maxWidth int) (Screenshot, error) {
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return Screenshot{}, fmt.Errorf("screenshot: not a PNG: %w", err)
	}
	if err := checkScreenSize(cfg.Width, cfg.Height); err != nil {
		return Screenshot{}, err
	}
	if maxWidth == 0 || cfg.Width <= maxWidth {
		return Screenshot{PNG: b, Width: cfg.Width, Height: cfg.Height, SourceWidth: cfg.Width, SourceHeight: cfg.Height}, nil
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return Screenshot{}, fmt.Errorf("screenshot: PNG: %w", err)
	}
	return NewScreenshot(img, maxWidth)
}

// NewScreenshot encodes img as a PNG, scaled down to maxWidth first when
// it is wider (maxWidth 0: never).
func NewScreenshot(img image.Image, maxWidth int) (Screenshot, error) {
	b := img.Bounds()
	if err := checkScreenSize(b.Dx(), b.Dy()); err != nil {
		return Screenshot{}, err
	}
	out := img
	if maxWidth > 0 && b.Dx() > maxWidth {
		h := max(1, (b.Dy()*maxWidth+b.Dx()/2)/b.Dx())
		out = ScaleDown(img, maxWidth, h)
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, out); err != nil {
		return Screenshot{}, fmt.Errorf("screenshot: encode PNG: %w", err)
	}
	ob := out.Bounds()
	return Screenshot{PNG: buf.Bytes(), Width: ob.Dx(), Height: ob.Dy(), SourceWidth: b.Dx(), SourceHeight: b.Dy()}, nil
}

func checkScreenSize(w, h int) error {
	if w <= 0 || h <= 0 {
		return errors.New("screenshot: the display has no pixels (is the guest's display on?)")
	}
	if int64(w)*int64(h) > MaxScreenPixels {
		return fmt.Errorf("screenshot: a display of %d×%d pixels is over the %d this driver decodes", w, h, MaxScreenPixels)
	}
	return nil
}

// ScaleDown resamples src to w×h (no larger than src) by area averaging:
// each destination pixel is the mean of the source area it covers, with
// partly covered source pixels weighted by how much of them it covers.
func ScaleDown(src image.Image, w, h int) *image.RGBA {
	sb := src.Bounds()
	rgba, ok := src.(*image.RGBA)
	if !ok || sb.Min != (image.Point{}) {
		rgba = image.NewRGBA(image.Rect(0, 0, sb.Dx(), sb.Dy()))
		draw.Draw(rgba, rgba.Bounds(), src, sb.Min, draw.Src)
	}
	sw, sh := sb.Dx(), sb.Dy()
	w, h = min(max(w, 1), sw), min(max(h, 1), sh)
	cols, rows := areaWeights(sw, w), areaWeights(sh, h)
	// Horizontal pass: every source row to w columns, in float32.
	tmp := make([]float32, w*sh*4)
	for y := 0; y < sh; y++ {
		line := rgba.Pix[y*rgba.Stride:]
		for x, ws := range cols {
			var acc [4]float32
			for _, t := range ws {
				p := line[t.i*4:]
				for c := range 4 {
					acc[c] += float32(p[c]) * t.w
				}
			}
			copy(tmp[(y*w+x)*4:], acc[:])
		}
	}
	// Vertical pass: h rows of the w columns.
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	for y, ws := range rows {
		for x := 0; x < w; x++ {
			var acc [4]float32
			for _, t := range ws {
				p := tmp[(t.i*w+x)*4:]
				for c := range 4 {
					acc[c] += p[c] * t.w
				}
			}
			d := dst.Pix[y*dst.Stride+x*4:]
			for c := range 4 {
				d[c] = uint8(min(max(acc[c]+0.5, 0), 255))
			}
		}
	}
	return dst
}

// tap is one source pixel's share of a destination pixel.
type tap struct {
	i int
	w float32
}

// areaWeights returns, for each of n destination pixels along an axis of
// src source pixels, the source pixels it covers and their weights
// (summing to 1).
func areaWeights(src, n int) [][]tap {
	out := make([][]tap, n)
	scale := float64(src) / float64(n)
	for d := range n {
		lo, hi := float64(d)*scale, float64(d+1)*scale
		for i := int(lo); i < src && float64(i) < hi; i++ {
			cover := min(hi, float64(i+1)) - max(lo, float64(i))
			if cover > 0 {
				out[d] = append(out[d], tap{i: i, w: float32(cover / scale)})
			}
		}
	}
	return out
}

// DecodePPM decodes a binary PPM (P6, maxval 255), which libvirt's QEMU
// driver hands out for screenshots (QEMU's screendump without a format).
func DecodePPM(r io.Reader) (*image.RGBA, error) {
	br := bufio.NewReader(r)
	var hdr [4]int // magic checked below; width, height, maxval
	magic, err := ppmToken(br)
	if err != nil || magic != "P6" {
		return nil, fmt.Errorf("ppm: not a binary PPM (magic %q): %v", magic, err)
	}
	for i := 1; i < 4; i++ {
		tok, err := ppmToken(br)
		if err != nil {
			return nil, fmt.Errorf("ppm: header: %w", err)
		}
		if hdr[i], err = strconv.Atoi(tok); err != nil || hdr[i] <= 0 {
			return nil, fmt.Errorf("ppm: header field %q", tok)
		}
	}
	w, h, maxval := hdr[1], hdr[2], hdr[3]
	if maxval != 255 {
		return nil, fmt.Errorf("ppm: maxval %d (only 255 is read)", maxval)
	}
	if err := checkScreenSize(w, h); err != nil {
		return nil, err
	}
	// One whitespace byte ends the header; ppmToken consumed it.
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	row := make([]byte, w*3)
	for y := range h {
		if _, err := io.ReadFull(br, row); err != nil {
			return nil, fmt.Errorf("ppm: row %d of %d: %w", y, h, err)
		}
		p := img.Pix[y*img.Stride:]
		for x := range w {
			p[x*4], p[x*4+1], p[x*4+2], p[x*4+3] = row[x*3], row[x*3+1], row[x*3+2], 0xff
		}
	}
	return img, nil
}

// ppmToken reads one header token, skipping whitespace and # comments,
// and the one whitespace byte after it.
func ppmToken(r *bufio.Reader) (string, error) {
	var tok []byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		switch {
		case c == '#' && len(tok) == 0:
			if _, err := r.ReadBytes('\n'); err != nil {
				return "", err
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if len(tok) > 0 {
				return string(tok), nil
			}
		default:
			if len(tok) >= 16 {
				return "", errors.New("header token too long")
			}
			tok = append(tok, c)
		}
	}
}
