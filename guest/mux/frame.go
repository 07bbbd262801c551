package mux

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Frame kinds.
const (
	kindHello    byte = 1 // host → guest: nonce
	kindHelloAck byte = 2 // guest → host: nonce, then the helper's hello (JSON)
	kindRequest  byte = 3 // host → guest: a chunk of a request message
	kindReply    byte = 4 // guest → host: a chunk of a reply message
	kindCancel   byte = 5 // host → guest: the caller gave up on the stream
	kindReject   byte = 6 // guest → host: the stream was refused (payload: why)
	kindPing     byte = 7 // host → guest: are you there
	kindPong     byte = 8 // guest → host: the answer, same id
	kindNoHello  byte = 9 // guest → host: a request came before any hello; it did not run
)

// flagFin marks the last chunk of a message.
const flagFin byte = 1

// Frame layout before COBS: kind | flags | stream id (u32 BE) | payload |
// CRC-32C (u32 BE) of everything before it.
const (
	frameHead    = 6
	frameTail    = 4
	frameMinBody = frameHead + frameTail
)

// ChunkBytes is the most payload one frame carries: a message is cut into
// chunks that the writer interleaves with other streams' chunks.
const ChunkBytes = 16 << 10

// maxEncoded is the longest encoded frame (COBS adds a byte per 254) a
// decoder accepts before it gives the bytes up as garbage.
const maxEncoded = frameMinBody + ChunkBytes + (frameMinBody+ChunkBytes)/254 + 2

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// frame is one decoded frame. payload aliases the decoder's buffer.
type frame struct {
	kind    byte
	flags   byte
	id      uint32
	payload []byte
}

// errBadFrame: a frame failed its length or checksum (a torn frame from a
// connection that ended in the middle of it, or line noise).
var errBadFrame = errors.New("bad frame")

// appendFrame appends the encoded frame (COBS, then the 0x00 delimiter)
// to dst. scratch is reused for the raw body.
func appendFrame(dst, scratch []byte, kind, flags byte, id uint32, payload []byte) ([]byte, []byte) {
	raw := append(scratch[:0], kind, flags, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(raw[2:], id)
	raw = append(raw, payload...)
	raw = binary.BigEndian.AppendUint32(raw, crc32.Checksum(raw, crcTable))
	return append(cobsEncode(dst, raw), 0), raw
}

// parseFrame checks and splits a decoded body.
func parseFrame(raw []byte) (frame, error) {
	if len(raw) < frameMinBody {
		return frame{}, errBadFrame
	}
	body, sum := raw[:len(raw)-frameTail], raw[len(raw)-frameTail:]
	if crc32.Checksum(body, crcTable) != binary.BigEndian.Uint32(sum) {
		return frame{}, errBadFrame
	}
	return frame{kind: body[0], flags: body[1], id: binary.BigEndian.Uint32(body[2:6]), payload: body[frameHead:]}, nil
}

// cobsEncode appends the Consistent Overhead Byte Stuffing of src to dst:
// the result has no zero byte, so 0x00 can delimit frames and a reader
// that starts anywhere finds the next frame at the next zero.
func cobsEncode(dst, src []byte) []byte {
	codeAt := len(dst)
	dst = append(dst, 0)
	code := byte(1)
	for _, b := range src {
		if b != 0 {
			dst = append(dst, b)
			code++
		}
		if b == 0 || code == 0xff {
			dst[codeAt] = code
			codeAt = len(dst)
			dst = append(dst, 0)
			code = 1
		}
	}
	dst[codeAt] = code
	return dst
}

// cobsDecode appends the decoding of src (one encoded frame without its
// delimiter) to dst; false when src is not a valid encoding.
func cobsDecode(dst, src []byte) ([]byte, bool) {
	for i := 0; i < len(src); {
		code := int(src[i])
		if code == 0 || i+code > len(src) {
			return dst, false
		}
		dst = append(dst, src[i+1:i+code]...)
		i += code
		if code < 0xff && i < len(src) {
			dst = append(dst, 0)
		}
	}
	return dst, true
}

// decoder cuts a byte stream into frames at each 0x00 and checks them.
// Garbage (a torn frame, an over-long run) is dropped and counted; the
// next frame after the next zero decodes normally.
type decoder struct {
	enc     []byte // the current encoded frame so far
	raw     []byte // its decoding
	skip    bool   // discarding an over-long run until the next zero
	dropped int    // frames dropped as bad
}

// reset forgets a partial frame (the peer went away in the middle of it).
func (d *decoder) reset() { d.enc, d.skip = d.enc[:0], false }

// feed passes each complete frame in p to fn, in order. Frames passed to fn
// are only valid during the call.
func (d *decoder) feed(p []byte, fn func(frame) error) error {
	for len(p) > 0 {
		i := bytes.IndexByte(p, 0)
		if i < 0 {
			d.push(p)
			return nil
		}
		d.push(p[:i])
		p = p[i+1:]
		if d.skip || len(d.enc) == 0 {
			d.enc, d.skip = d.enc[:0], false
			continue
		}
		var ok bool
		d.raw, ok = cobsDecode(d.raw[:0], d.enc)
		d.enc = d.enc[:0]
		f, err := parseFrame(d.raw)
		if !ok || err != nil {
			d.dropped++
			continue
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) push(b []byte) {
	if d.skip {
		return
	}
	if len(d.enc)+len(b) > maxEncoded {
		d.enc, d.skip = d.enc[:0], true
		d.dropped++
		return
	}
	d.enc = append(d.enc, b...)
}
