package hypervisor

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// The call socket is how the host makes driver calls to a plugin it
// started: the Driver service's unary methods, the same protobuf messages
// and the same status errors as over gRPC, framed directly on a Unix socket
// with one connection per call in flight (connections are pooled and kept
// open, so a call costs one write and one read on each side).
//
// Why not gRPC: a gRPC unary call over go-plugin's socket cost 150–330 µs
// p50 on the 2-core reference machine while other work ran, against 35–70
// µs for a bare write/read ping-pong between two processes and 60–130 µs
// for the call socket (docs/performance.md). AutoMTLS was lost in the
// noise; static flow-control windows (no BDP ping per call) saved about a
// third; the rest is gRPC's hand-offs between goroutines (the caller, the
// transport's writer and reader goroutines on each side, the server's
// handler goroutine; each a wake-up of another thread on a busy machine).
// The call socket does what a call needs and nothing else: the caller
// writes its request and reads the answer itself, and the plugin runs the
// method in the goroutine that read the request, which writes the answer.
//
// gRPC stays for everything else go-plugin does (handshake, plugin stderr,
// shutdown) and carries the driver calls when a plugin offers no call
// socket (one built before it existed).
//
// # Where the socket lives, and who may connect
//
// go-plugin gives each plugin process a directory of its own for its
// sockets (PLUGIN_UNIX_SOCKET_DIR, made by the host with os.MkdirTemp, mode
// 0700). The plugin listens on CallSocketName inside it, mode 0600, and
// only after checking that the directory is a real directory owned by its
// own uid that nobody else can enter (checkPrivateDir); the host checks the
// same before it connects. The plugin also checks each connecting peer's
// uid (SO_PEERCRED) against its own. So only the user vmgate runs as (and
// root) can reach the socket, which is what AutoMTLS protected as well: a
// process of that user could read the server's memory anyway.
//
// # Wire format
//
// A connection starts with both sides writing callHello. Then the host
// sends requests and the plugin answers them, one at a time, in order:
//
//	request:  u32 length | u8 frameCall | u8 len | method | i64 timeout ns (0: none) | protobuf request
//	response: u32 length | u8 frameReply | protobuf response
//	       or u32 length | u8 frameStatus | protobuf google.rpc.Status (code, message, details)
//
// length (big endian) counts the bytes after it and is at most
// maxFrameBytes. The host cancels a call by closing its connection: the
// plugin sees the end of the stream and cancels the call's context. A
// connection on which anything goes wrong is closed, never reused.

// CallSocketName is the file name of a plugin's call socket in its socket
// directory.
const CallSocketName = "driver-calls.sock"

// callHello opens every call socket connection, both ways.
const callHello = "vmgate-driver-calls/1\n"

// Frame types.
const (
	frameCall   byte = 1
	frameReply  byte = 2
	frameStatus byte = 3
)

// frameHeaderBytes is the length field and the type.
const frameHeaderBytes = 5

// maxFrameBytes bounds a frame: one message of MaxMessageBytes and its
// header.
const maxFrameBytes = MaxMessageBytes + 512

// errFrameTooLarge: a frame's length is over maxFrameBytes.
var errFrameTooLarge = errors.New("frame too large")

// checkPrivateDir accepts a directory (not a symlink) owned by this
// process's effective uid with no permission bits for group or others.
func checkPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s has mode %#o; want no access for group and others", dir, perm)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner information", dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by this process's uid %d", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// appendFrameHeader appends a frame's length field (patched by
// finishFrame) and its type to b.
func appendFrameHeader(b []byte, typ byte) []byte {
	return append(b, 0, 0, 0, 0, typ)
}

// finishFrame writes the length of the frame that starts at b[0], whose
// message starts at b[msg]; a message over MaxMessageBytes is refused.
func finishFrame(b []byte, msg int) ([]byte, error) {
	if n := len(b) - msg; n > MaxMessageBytes {
		return nil, fmt.Errorf("%w: a message of %d bytes, at most %d", errFrameTooLarge, n, MaxMessageBytes)
	}
	n := len(b) - 4
	binary.BigEndian.PutUint32(b, uint32(n))
	return b, nil
}

// readFrame reads one frame and returns its type and body. The body is
// only valid until the next read from r.
func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 1 || n > maxFrameBytes {
		return 0, nil, fmt.Errorf("%w: %d bytes", errFrameTooLarge, n)
	}
	var body []byte
	if int(n) <= r.Size() {
		// Peek avoids a copy; the caller is done with it before reading again.
		b, err := r.Peek(int(n))
		if err != nil {
			return 0, nil, unexpectedEOF(err)
		}
		body = b
		r.Discard(int(n))
	} else {
		body = make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, nil, unexpectedEOF(err)
		}
	}
	return body[0], body[1:], nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// exchangeHello writes callHello on rw and checks that the peer wrote it
// too.
func exchangeHello(w io.Writer, r *bufio.Reader) error {
	if _, err := io.WriteString(w, callHello); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	got := make([]byte, len(callHello))
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if string(got) != callHello {
		return fmt.Errorf("hello: peer said %q; want %q", got, callHello)
	}
	return nil
}
