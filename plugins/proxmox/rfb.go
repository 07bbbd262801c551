package proxmox

import (
	"bufio"
	"crypto/des"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"io"

	"github.com/vmgate/vmgate/hypervisor"
)

// A small RFB client (RFC 6143, protocol 3.8) that reads one whole frame:
// the version, VNC authentication with the password vncproxy handed out
// (the challenge DES-encrypted with the password's first 8 bytes, each
// byte's bits reversed, as every VNC viewer does), ClientInit (shared),
// ServerInit, then a 32-bit true-colour pixel format, raw encoding only,
// and one non-incremental FramebufferUpdateRequest for the whole screen.

// Client-to-server and server-to-client message types (RFC 6143 7.5, 7.6).
const (
	rfbSetPixelFormat  = 0
	rfbSetEncodings    = 2
	rfbUpdateRequest   = 3
	rfbFramebufferUpd  = 0
	rfbSetColourMap    = 1
	rfbBell            = 2
	rfbServerCutText   = 3
	rfbSecurityVNCAuth = 2
	rfbEncodingRaw     = 0
	rfbMaxText         = 1 << 16
)

// rfbFrame reads one frame of the display behind rw.
func rfbFrame(rw io.ReadWriter, password string) (*image.RGBA, error) {
	r := bufio.NewReaderSize(rw, 64<<10)
	if err := rfbHandshake(r, rw, password); err != nil {
		return nil, err
	}
	// ClientInit (shared), ServerInit.
	if _, err := rw.Write([]byte{1}); err != nil {
		return nil, err
	}
	var init struct {
		W, H uint16
		PF   [16]byte
		NLen uint32
	}
	if err := binary.Read(r, binary.BigEndian, &init); err != nil {
		return nil, fmt.Errorf("rfb: server init: %w", err)
	}
	if _, err := skip(r, init.NLen); err != nil {
		return nil, fmt.Errorf("rfb: server init: %w", err)
	}
	w, h := int(init.W), int(init.H)
	if w == 0 || h == 0 || w*h > hypervisor.MaxScreenPixels {
		return nil, fmt.Errorf("rfb: a display of %d×%d", w, h)
	}
	var msgs []byte
	// SetPixelFormat: 32 bpp, depth 24, little endian, true colour, 8 bits
	// per channel, red at bit 16, green 8, blue 0.
	msgs = append(msgs, rfbSetPixelFormat, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0)
	msgs = append(msgs, rfbSetEncodings, 0, 0, 1, 0, 0, 0, rfbEncodingRaw)
	msgs = append(msgs, rfbUpdateRequest, 0, 0, 0, 0, 0)
	msgs = binary.BigEndian.AppendUint16(msgs, init.W)
	msgs = binary.BigEndian.AppendUint16(msgs, init.H)
	if _, err := rw.Write(msgs); err != nil {
		return nil, err
	}
	return rfbReadUpdate(r, w, h)
}

// rfbHandshake is the version and the security handshake.
func rfbHandshake(r *bufio.Reader, w io.Writer, password string) error {
	var ver [12]byte
	if _, err := io.ReadFull(r, ver[:]); err != nil {
		return fmt.Errorf("rfb: version: %w", err)
	}
	if string(ver[:4]) != "RFB " || string(ver[:11]) < "RFB 003.008" {
		return fmt.Errorf("rfb: server speaks %q; want RFB 3.8", ver)
	}
	if _, err := io.WriteString(w, "RFB 003.008\n"); err != nil {
		return err
	}
	n, err := r.ReadByte()
	if err != nil {
		return fmt.Errorf("rfb: security types: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("rfb: the server refused the connection: %s", rfbReason(r))
	}
	types := make([]byte, n)
	if _, err := io.ReadFull(r, types); err != nil {
		return fmt.Errorf("rfb: security types: %w", err)
	}
	found := false
	for _, t := range types {
		found = found || t == rfbSecurityVNCAuth
	}
	if !found {
		return fmt.Errorf("rfb: the server offers security types %v, not VNC authentication", types)
	}
	if _, err := w.Write([]byte{rfbSecurityVNCAuth}); err != nil {
		return err
	}
	var challenge [16]byte
	if _, err := io.ReadFull(r, challenge[:]); err != nil {
		return fmt.Errorf("rfb: challenge: %w", err)
	}
	if _, err := w.Write(vncAuthResponse(challenge, password)); err != nil {
		return err
	}
	var result uint32
	if err := binary.Read(r, binary.BigEndian, &result); err != nil {
		return fmt.Errorf("rfb: security result: %w", err)
	}
	if result != 0 {
		return fmt.Errorf("rfb: VNC authentication failed: %s", rfbReason(r))
	}
	return nil
}

// vncAuthResponse encrypts the challenge with the password as VNC does.
func vncAuthResponse(challenge [16]byte, password string) []byte {
	var key [8]byte
	copy(key[:], password)
	for i, b := range key {
		var rev byte
		for j := range 8 {
			rev |= (b >> j & 1) << (7 - j)
		}
		key[i] = rev
	}
	c, _ := des.NewCipher(key[:]) // 8 bytes: no error
	out := make([]byte, 16)
	c.Encrypt(out[:8], challenge[:8])
	c.Encrypt(out[8:], challenge[8:])
	return out
}

// rfbReason reads a failure's reason string.
func rfbReason(r *bufio.Reader) string {
	var n uint32
	if binary.Read(r, binary.BigEndian, &n) != nil || n > rfbMaxText {
		return "(no reason)"
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "(no reason)"
	}
	return string(b)
}

func skip(r *bufio.Reader, n uint32) (int, error) {
	if n > rfbMaxText {
		return 0, errors.New("text too long")
	}
	return r.Discard(int(n))
}

// rfbReadUpdate reads server messages until a FramebufferUpdate, and
// returns its pixels.
func rfbReadUpdate(r *bufio.Reader, w, h int) (*image.RGBA, error) {
	for {
		t, err := r.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("rfb: %w", err)
		}
		switch t {
		case rfbFramebufferUpd:
			return rfbRects(r, w, h)
		case rfbSetColourMap:
			var hdr struct {
				Pad    byte
				First  uint16
				Number uint16
			}
			if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
				return nil, err
			}
			if _, err := r.Discard(int(hdr.Number) * 6); err != nil {
				return nil, err
			}
		case rfbBell:
		case rfbServerCutText:
			var hdr struct {
				Pad [3]byte
				N   uint32
			}
			if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
				return nil, err
			}
			if _, err := skip(r, hdr.N); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("rfb: unknown server message %d", t)
		}
	}
}

// rfbRects reads a FramebufferUpdate's raw rectangles into a w×h image.
func rfbRects(r *bufio.Reader, w, h int) (*image.RGBA, error) {
	var hdr struct {
		Pad    byte
		NRects uint16
	}
	if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
		return nil, err
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for range int(hdr.NRects) {
		var rc struct {
			X, Y, W, H uint16
			Enc        int32
		}
		if err := binary.Read(r, binary.BigEndian, &rc); err != nil {
			return nil, err
		}
		if rc.Enc != rfbEncodingRaw {
			return nil, fmt.Errorf("rfb: rectangle in encoding %d; only raw was asked for", rc.Enc)
		}
		x, y, rw, rh := int(rc.X), int(rc.Y), int(rc.W), int(rc.H)
		if x+rw > w || y+rh > h {
			return nil, fmt.Errorf("rfb: rectangle %dx%d at %d,%d outside the %dx%d display", rw, rh, x, y, w, h)
		}
		row := make([]byte, rw*4)
		for j := range rh {
			if _, err := io.ReadFull(r, row); err != nil {
				return nil, fmt.Errorf("rfb: pixels: %w", err)
			}
			p := img.Pix[(y+j)*img.Stride+x*4:]
			for i := range rw {
				// Little endian 0x00RRGGBB: B, G, R, unused.
				p[i*4], p[i*4+1], p[i*4+2], p[i*4+3] = row[i*4+2], row[i*4+1], row[i*4], 0xff
			}
		}
	}
	return img, nil
}
