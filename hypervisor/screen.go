package hypervisor

import (
	"context"
	"fmt"
)

// The optional capabilities for a guest whose agent cannot help (stuck at
// boot, a kernel panic, a login or installer screen, an appliance without
// an agent, an agent that died): its display, its keyboard and its serial
// console. Each goes through the hypervisor alone, never through the guest
// agent, so each works whether the agent answers or not.
//
// Every method is bounded by ctx like the Driver's. Requests are checked
// (their Validate) before any side effect; a bad one is ErrInvalidArgument.
// A VM the backend cannot serve this way (no display device, no serial
// port the driver can reach) is ErrNotSupported with the reason and what
// to change, so the agent reads what the backend lacks.

// Screener is an optional capability: a driver that can capture a VM's
// display implements it.
type Screener interface {
	// Screenshot returns the VM's display now as a PNG, scaled down to
	// req.MaxWidth when it is wider (see NewScreenshot).
	Screenshot(ctx context.Context, vm string, req ScreenshotRequest) (Screenshot, error)
}

// KeySender is an optional capability: a driver that can press keys on a
// VM's keyboard implements it.
type KeySender interface {
	// SendKeys presses req's key combinations, or types its text, in
	// order, and returns once the backend has taken every key press (the
	// guest may still be reacting to the last ones). The driver expands
	// and checks req with req.Presses before pressing anything: a key name
	// it does not know or a character the keymap cannot type presses no key.
	SendKeys(ctx context.Context, vm string, req KeysRequest) error
}

// ConsoleReader is an optional capability: a driver that can read what a
// VM wrote to its serial console implements it.
type ConsoleReader interface {
	// ConsoleRead returns console output: what came after req.Since, or
	// the last req.TailBytes. Output is numbered by byte offsets from the
	// start of what the driver can see of the console (a cursor); what a
	// backend no longer keeps is counted in Dropped, never made up.
	ConsoleRead(ctx context.Context, vm string, req ConsoleReadRequest) (ConsoleChunk, error)
}

// ConsoleWriter is an optional capability: a driver that can write to a
// VM's serial console (what a person types on a serial terminal)
// implements it.
type ConsoleWriter interface {
	// ConsoleWrite sends data to the serial console's input, whole, and
	// returns once the backend has taken it all.
	ConsoleWrite(ctx context.Context, vm string, data []byte) error
}

// Limits of the screen, keyboard and console requests, checked by their
// Validate before any side effect. A server may hold its callers to less.
const (
	// MinScreenshotWidth and MaxScreenshotWidth bound
	// ScreenshotRequest.MaxWidth when it is set.
	MinScreenshotWidth = 16
	MaxScreenshotWidth = 8192
	// DefaultConsoleReadBytes is ConsoleReadRequest.MaxBytes when 0.
	DefaultConsoleReadBytes = 64 << 10
	// MaxConsoleReadBytes bounds ConsoleReadRequest.MaxBytes and TailBytes.
	MaxConsoleReadBytes = 1 << 20
	// MaxConsoleWriteBytes bounds one ConsoleWrite.
	MaxConsoleWriteBytes = 64 << 10
)

// ScreenshotRequest is what Screenshot takes.
type ScreenshotRequest struct {
	// MaxWidth, when positive, is the widest image to return: a wider
	// display is scaled down to it, keeping its aspect ratio. 0 means the
	// display's own size.
	MaxWidth int `json:"max_width,omitempty"`
}

// Validate checks r without side effects.
func (r ScreenshotRequest) Validate() error {
	if r.MaxWidth != 0 && (r.MaxWidth < MinScreenshotWidth || r.MaxWidth > MaxScreenshotWidth) {
		return fmt.Errorf("screenshot: %w: max width %d: want 0 (the display's own size) or %d..%d",
			ErrInvalidArgument, r.MaxWidth, MinScreenshotWidth, MaxScreenshotWidth)
	}
	return nil
}

// Screenshot is a VM's display as a PNG.
type Screenshot struct {
	// PNG is the image, encoded.
	PNG []byte `json:"-"`
	// Width and Height are the PNG's size in pixels.
	Width  int `json:"width"`
	Height int `json:"height"`
	// SourceWidth and SourceHeight are the display's own size (the same
	// as Width and Height unless the image was scaled down).
	SourceWidth  int `json:"source_width"`
	SourceHeight int `json:"source_height"`
}

// ConsoleReadRequest is what ConsoleRead takes: output after a cursor
// (Since, 0 for everything the driver still has), or the last TailBytes.
type ConsoleReadRequest struct {
	// Since is a Cursor an earlier ConsoleChunk returned.
	Since int64 `json:"since,omitempty"`
	// TailBytes, when positive, asks for the last TailBytes bytes instead
	// (Since must then be 0).
	TailBytes int `json:"tail_bytes,omitempty"`
	// MaxBytes caps the bytes returned; 0 means DefaultConsoleReadBytes.
	MaxBytes int `json:"max_bytes,omitempty"`
}

// Validate checks r without side effects.
func (r ConsoleReadRequest) Validate() error {
	switch {
	case r.Since < 0:
		return fmt.Errorf("console read: %w: since %d is negative", ErrInvalidArgument, r.Since)
	case r.TailBytes < 0 || r.TailBytes > MaxConsoleReadBytes:
		return fmt.Errorf("console read: %w: tail bytes %d: want 1..%d", ErrInvalidArgument, r.TailBytes, MaxConsoleReadBytes)
	case r.TailBytes > 0 && r.Since > 0:
		return fmt.Errorf("console read: %w: give since or tail bytes, not both", ErrInvalidArgument)
	case r.MaxBytes < 0 || r.MaxBytes > MaxConsoleReadBytes:
		return fmt.Errorf("console read: %w: max bytes %d: want 0 (the default, %d) or 1..%d",
			ErrInvalidArgument, r.MaxBytes, DefaultConsoleReadBytes, MaxConsoleReadBytes)
	}
	return nil
}

// Limit is the most bytes r may return: TailBytes when set (within
// MaxBytes when that is set too), else MaxBytes or its default.
func (r ConsoleReadRequest) Limit() int {
	max := r.MaxBytes
	if max == 0 {
		max = DefaultConsoleReadBytes
	}
	if r.TailBytes > 0 {
		if r.MaxBytes == 0 {
			return r.TailBytes
		}
		return min(r.TailBytes, max)
	}
	return max
}

// ConsoleChunk is console output with its place in the stream.
type ConsoleChunk struct {
	// Data is the output, raw bytes as the guest wrote them.
	Data []byte `json:"-"`
	// Start is the offset of Data's first byte.
	Start int64 `json:"start"`
	// Cursor is the offset after Data: the Since of the next read.
	Cursor int64 `json:"cursor"`
	// Dropped counts bytes after the request's Since (or before the tail)
	// that the backend no longer keeps: they were overwritten before
	// anyone read them.
	Dropped int64 `json:"dropped,omitempty"`
	// More says output past Cursor is already there (MaxBytes cut Data).
	More bool `json:"more,omitempty"`
	// Reset says the console started over since the cursor (the VM was
	// started anew, or the driver's view of the console was): offsets
	// count from the new start, and Data is from there.
	Reset bool `json:"reset,omitempty"`
}

// ValidateConsoleWrite checks data for ConsoleWrite without side effects.
func ValidateConsoleWrite(data []byte) error {
	if len(data) == 0 {
		return fmt.Errorf("console write: %w: nothing to write", ErrInvalidArgument)
	}
	if len(data) > MaxConsoleWriteBytes {
		return fmt.Errorf("console write: %w: %d bytes, at most %d", ErrInvalidArgument, len(data), MaxConsoleWriteBytes)
	}
	return nil
}
