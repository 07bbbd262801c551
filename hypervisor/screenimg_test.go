package hypervisor_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

func encodePNG(t *testing.T, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// stripes is w×h with vertical stripes one pixel wide, black and white.
func stripes(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			v := uint8(0)
			if x%2 == 1 {
				v = 255
			}
			img.Set(x, y, color.RGBA{v, v, v, 255})
		}
	}
	return img
}

func TestScreenshotFromPNG(t *testing.T) {
	src := stripes(720, 400)
	raw := encodePNG(t, src)
	tests := []struct {
		maxWidth     int
		w, h         int
		passedAsIs   bool
		sourceW, srH int
	}{
		{0, 720, 400, true, 720, 400},
		{720, 720, 400, true, 720, 400},
		{1024, 720, 400, true, 720, 400},
		{360, 360, 200, false, 720, 400},
		{100, 100, 56, false, 720, 400},
		{16, 16, 9, false, 720, 400},
	}
	for _, tt := range tests {
		shot, err := hypervisor.ScreenshotFromPNG(raw, tt.maxWidth)
		if err != nil {
			t.Fatalf("ScreenshotFromPNG(maxWidth %d) error: %v", tt.maxWidth, err)
		}
		if shot.Width != tt.w || shot.Height != tt.h || shot.SourceWidth != tt.sourceW || shot.SourceHeight != tt.srH {
			t.Errorf("ScreenshotFromPNG(maxWidth %d) = %d×%d from %d×%d; want %d×%d from %d×%d",
				tt.maxWidth, shot.Width, shot.Height, shot.SourceWidth, shot.SourceHeight, tt.w, tt.h, tt.sourceW, tt.srH)
		}
		if got := bytes.Equal(shot.PNG, raw); got != tt.passedAsIs {
			t.Errorf("ScreenshotFromPNG(maxWidth %d) returned the PNG as it came: %v; want %v", tt.maxWidth, got, tt.passedAsIs)
		}
		img, err := png.Decode(bytes.NewReader(shot.PNG))
		if err != nil {
			t.Fatalf("ScreenshotFromPNG(maxWidth %d): the PNG does not decode: %v", tt.maxWidth, err)
		}
		if b := img.Bounds(); b.Dx() != shot.Width || b.Dy() != shot.Height {
			t.Errorf("ScreenshotFromPNG(maxWidth %d): PNG is %v; the Screenshot says %d×%d", tt.maxWidth, b, shot.Width, shot.Height)
		}
	}
}

// TestScaleDownAverages: halving one-pixel stripes gives their average
// (mid grey), where dropping every other column would give black or white.
func TestScaleDownAverages(t *testing.T) {
	out := hypervisor.ScaleDown(stripes(100, 10), 50, 5)
	if b := out.Bounds(); b.Dx() != 50 || b.Dy() != 5 {
		t.Fatalf("ScaleDown to 50×5 = %v", b)
	}
	for y := range 5 {
		for x := range 50 {
			if c := out.RGBAAt(x, y); c.R < 126 || c.R > 129 || c.A != 255 {
				t.Fatalf("ScaleDown pixel (%d,%d) = %v; want mid grey (127 or 128), opaque", x, y, c)
			}
		}
	}
	// A third: columns cover 1.5 source pixels each, weighted by coverage.
	bww := image.NewRGBA(image.Rect(0, 0, 3, 1))
	bww.Set(0, 0, color.RGBA{0, 0, 0, 255})
	bww.Set(1, 0, color.RGBA{255, 255, 255, 255})
	bww.Set(2, 0, color.RGBA{255, 255, 255, 255})
	out = hypervisor.ScaleDown(bww, 2, 1)
	if l, r := out.RGBAAt(0, 0).R, out.RGBAAt(1, 0).R; l != 85 || r != 255 {
		t.Errorf("ScaleDown(black white white, to 2) = %d, %d; want 85 (a third white), 255", l, r)
	}
}

func TestDecodePPM(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("P6\n# a comment\n3 2\n255\n")
	for i := range 6 {
		b.Write([]byte{byte(i * 40), byte(i*40 + 1), byte(i*40 + 2)})
	}
	img, err := hypervisor.DecodePPM(&b)
	if err != nil {
		t.Fatalf("DecodePPM() error: %v", err)
	}
	if img.Bounds().Dx() != 3 || img.Bounds().Dy() != 2 {
		t.Fatalf("DecodePPM() size %v; want 3×2", img.Bounds())
	}
	if c := img.RGBAAt(2, 1); c != (color.RGBA{200, 201, 202, 255}) {
		t.Errorf("DecodePPM() pixel (2,1) = %v; want {200 201 202 255}", c)
	}
	for _, bad := range []string{
		"P3\n1 1\n255\n0 0 0\n",      // ASCII PPM
		"P6\n1 1\n65535\n\x00\x00",   // 16-bit
		"P6\n2 2\n255\n\x00\x00\x00", // short
		"P6\n-1 1\n255\n",
		"P6\n100000 100000\n255\n", // over MaxScreenPixels: refused before reading pixels
		"P6\n" + strings.Repeat("9", 40) + " 1\n255\n",
	} {
		if _, err := hypervisor.DecodePPM(strings.NewReader(bad)); err == nil {
			t.Errorf("DecodePPM(%q) = nil error; want one", bad)
		}
	}
}

// TestScreenshotRefusesHugePNG: a PNG whose header claims more pixels than
// a driver decodes is refused from its header, before any pixel is read.
func TestScreenshotRefusesHugePNG(t *testing.T) {
	// A valid IHDR for 100000×100000, and no image data at all.
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], 100000)
	binary.BigEndian.PutUint32(ihdr[4:], 100000)
	ihdr[8], ihdr[9] = 8, 6
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	binary.Write(&b, binary.BigEndian, uint32(len(ihdr)))
	chunk := append([]byte("IHDR"), ihdr...)
	b.Write(chunk)
	binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(chunk))
	_, err := hypervisor.ScreenshotFromPNG(b.Bytes(), 100)
	if err == nil || !strings.Contains(err.Error(), "100000×100000") {
		t.Errorf("ScreenshotFromPNG(100000×100000 header) = %v; want a refusal naming the size", err)
	}
	if _, err := hypervisor.ScreenshotFromPNG([]byte("GIF89a"), 0); err == nil {
		t.Errorf("ScreenshotFromPNG(GIF) = nil error; want one")
	}
}

func TestScreenshotRequestValidate(t *testing.T) {
	for _, w := range []int{-1, 1, 15, 8193} {
		if err := (hypervisor.ScreenshotRequest{MaxWidth: w}).Validate(); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("ScreenshotRequest{MaxWidth: %d}.Validate() = %v; want ErrInvalidArgument", w, err)
		}
	}
	for _, w := range []int{0, 16, 640, 8192} {
		if err := (hypervisor.ScreenshotRequest{MaxWidth: w}).Validate(); err != nil {
			t.Errorf("ScreenshotRequest{MaxWidth: %d}.Validate() = %v; want nil", w, err)
		}
	}
}

func TestConsoleRequestsValidate(t *testing.T) {
	bad := []hypervisor.ConsoleReadRequest{
		{Since: -1}, {TailBytes: -1}, {TailBytes: hypervisor.MaxConsoleReadBytes + 1},
		{Since: 5, TailBytes: 5}, {MaxBytes: -1}, {MaxBytes: hypervisor.MaxConsoleReadBytes + 1},
	}
	for _, r := range bad {
		if err := r.Validate(); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("%+v.Validate() = %v; want ErrInvalidArgument", r, err)
		}
	}
	limits := []struct {
		r    hypervisor.ConsoleReadRequest
		want int
	}{
		{hypervisor.ConsoleReadRequest{}, hypervisor.DefaultConsoleReadBytes},
		{hypervisor.ConsoleReadRequest{Since: 10, MaxBytes: 100}, 100},
		{hypervisor.ConsoleReadRequest{TailBytes: 200000}, 200000},
		{hypervisor.ConsoleReadRequest{TailBytes: 500, MaxBytes: 100}, 100},
	}
	for _, l := range limits {
		if err := l.r.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v; want nil", l.r, err)
		}
		if got := l.r.Limit(); got != l.want {
			t.Errorf("%+v.Limit() = %d; want %d", l.r, got, l.want)
		}
	}
	for _, n := range []int{0, hypervisor.MaxConsoleWriteBytes + 1} {
		if err := hypervisor.ValidateConsoleWrite(make([]byte, n)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("ValidateConsoleWrite(%d bytes) = %v; want ErrInvalidArgument", n, err)
		}
	}
	if err := hypervisor.ValidateConsoleWrite([]byte(fmt.Sprintf("echo %d\n", 42))); err != nil {
		t.Errorf("ValidateConsoleWrite(a command) = %v; want nil", err)
	}
}
