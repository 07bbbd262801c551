// Package mux is the framing vmgate and vmgate-guest's resident helper
// speak on one byte stream: a virtio-serial port (org.vmgate.guest.0),
// whose host end QEMU or libvirt exposes as a unix socket, or the helper's
// own unix socket in the guest. It imports only the standard library, so
// the drivers (host side) and the helper (guest side) share it.
//
// # Frames
//
// Every frame is COBS-encoded (Consistent Overhead Byte Stuffing: no zero
// byte inside) and ends with a 0x00 byte. Decoded, a frame is
//
//	kind u8 | flags u8 | stream id u32 BE | payload (≤ ChunkBytes) | CRC-32C u32 BE
//
// The zero delimiter is what makes the stream survive a host that closes
// and reopens its end at any byte: a reader that starts in the middle of a
// frame, or sees one torn off, drops bytes up to the next zero, and the
// CRC drops a torn frame glued to the start of a new one. A host writes
// 0x01 0x00 before each hello, so whatever was left half-written on the
// line ends there and fails its CRC (even a frame that lacked only its
// delimiter: the 0x01 changes it).
//
// # Streams and messages
//
// A call is a stream: the host picks its id (random start, then counting
// up, per connection), sends the request as one message, and the guest
// answers with one reply message on the same id. A message is cut into
// chunks of at most ChunkBytes; the last one has flagFin. A message is
//
//	uvarint header length | header (JSON) | body
//
// with a Request's header {"args":[...],"timeout_ms":N} and its standard
// input as the body, and a Reply's header {"exit":N} and the command's
// standard output as the body: exactly what `vmgate-guest ARGS < STDIN`
// would print. The host may send kindCancel for a stream it gave up on;
// the guest answers a stream it will not serve (too large, too many in
// flight) with kindReject and a reason.
//
// # Flow control
//
// Each side has one writer (sender) that sends control frames first and
// then one chunk of each pending message in turn, so one large transfer
// never holds the line against a small call. There are no windows: a
// receiver never blocks on its application (it assembles a message into
// memory, bounded by MaxMessageBytes per message and MaxStreams in
// flight), so the byte stream's own backpressure is enough.
//
// # Hello and epochs
//
// A connection starts with the host's kindHello (16 random bytes), which
// the guest answers with kindHelloAck: the same bytes and the helper's
// hello (version, SHA-256 of its binary, pid). The host ignores every
// frame until the answer to its own hello, and resends the hello until it
// comes (a guest helper that starts later, or a guest still draining an
// old connection). On the guest, a hello (or the host's end closing)
// starts a new epoch: replies to requests of an earlier epoch are dropped
// unsent, as their caller is gone, and the requests themselves run on. A
// request in an epoch that has seen no hello does not run: it is a stale
// one, left in a buffer by a host that has gone, or it comes from a host
// whose connection predates this helper (a helper restarted behind a port
// whose host end stayed open). The guest answers it with kindNoHello, and
// the host gives that connection up (ErrNeedHello: the call did not run)
// and dials again.
//
// # Liveness
//
// A virtio-serial port's host end stays connected when the guest's
// helper dies (QEMU keeps its socket open, and buffers), so the host
// pings every Options.PingEvery and gives the connection up when the
// guest has owed an answer (a call in flight, a ping) and sent nothing for
// Options.SilenceLimit: calls in flight fail (Client.Call) with ErrSilent,
// saying how long and what was owed, and the next call dials again. A
// guest that is slow is not a guest that is gone: any frame counts as
// life, silence counts only while the guest owes something, and it is
// counted in the keepalive's own ticks, so that a host process that was
// not scheduled does not blame the guest for its own stall. The limit is
// generous by default (DefaultSilenceLimit) for an emulated guest on a
// loaded host; DialWith sets another.
package mux

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Limits.
const (
	// MaxMessageBytes bounds one message (a run's 64 MiB of stdin, a
	// file read's 16 MiB of data, with room for their envelopes).
	MaxMessageBytes = 80 << 20
	// MaxStreams bounds the calls one connection has in flight.
	MaxStreams = 64
	// nonceBytes is the size of a hello's nonce.
	nonceBytes = 16
)

// Request is one helper command: its arguments (without the program
// name), its standard input, and how long the caller waits for it.
type Request struct {
	Args      []string `json:"args"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Stdin     []byte   `json:"-"`
}

// Reply is a command's exit status and its standard output.
type Reply struct {
	Exit   int    `json:"exit"`
	Stdout []byte `json:"-"`
}

// ErrRejected: the guest refused the stream (Error says why).
var ErrRejected = errors.New("mux: request rejected")

// encodeMessage is uvarint(len(header)) | header JSON | body.
func encodeMessage(hdr any, body []byte) ([]byte, error) {
	h, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, binary.MaxVarintLen32+len(h)+len(body))
	out = binary.AppendUvarint(out, uint64(len(h)))
	out = append(out, h...)
	return append(out, body...), nil
}

// decodeMessage splits a message into its header (decoded into hdr) and body.
func decodeMessage(b []byte, hdr any) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, errors.New("mux: message header length out of range")
	}
	if err := json.Unmarshal(b[k:k+int(n)], hdr); err != nil {
		return nil, fmt.Errorf("mux: message header: %w", err)
	}
	return b[k+int(n):], nil
}
