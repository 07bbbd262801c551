package pveemu

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// The websocket side of pve-http-server (src/PVE/APIServer/AnyEvent.pm):
// a GET whose path ends in "websocket" with an Upgrade header is checked
// (Upgrade must be websocket, Sec-WebSocket-Version 13, a key), its API
// method runs (vncwebsocket: the ticket), and on 200 websocket_proxy
// relays between the websocket and localhost:PORT of the answer: what the
// port sends goes out as binary frames of at most 128 KiB, unmasked; what
// the client sends must come in unfragmented, masked frames of at most
// 128 KiB without RSV bits (else the connection is dropped); text and
// binary frames are relayed, a ping is answered with a pong, a close
// shuts both sides down.

// wsMaxPayload is websocket_proxy's $max_payload_size.
const wsMaxPayload = 128 * 1024

// wsUpgrade checks the upgrade headers as unshift_read_header does;
// ok false means the request is no websocket request at all.
func wsUpgrade(r *http.Request) (accept, proto string, ok bool, err error) {
	up := r.Header.Get("Upgrade")
	if up == "" || r.Method != http.MethodGet {
		return "", "", false, nil
	}
	if up != "websocket" {
		return "", "", true, fmt.Errorf("unable to upgrade to protocol '%s'", up)
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "13" {
		return "", "", true, fmt.Errorf("unsupported websocket-version '%s'", v)
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if key == "" {
		return "", "", true, errors.New("missing websocket-key")
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(sum[:]), r.Header.Get("Sec-WebSocket-Protocol"), true, nil
}

// websocketProxy is websocket_proxy to localhost:port.
func (e *Emulator) websocketProxy(w http.ResponseWriter, accept, proto string, port int) {
	back, err := net.DialTimeout("tcp", net.JoinHostPort("localhost", strconv.Itoa(port)), 5*time.Second)
	if err != nil {
		http.Error(w, fmt.Sprintf("connect to 'localhost:%d' failed: %v", port, err), http.StatusInternalServerError)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		back.Close()
		http.Error(w, "no websocket on this connection", http.StatusInternalServerError)
		return
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		back.Close()
		return
	}
	e.wg.Go(func() {
		defer c.Close()
		defer back.Close()
		res := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n"
		if proto != "" {
			res += "Sec-WebSocket-Protocol: " + proto + "\r\n"
		}
		if _, err := io.WriteString(c, res+"\r\n"); err != nil {
			return
		}
		done := make(chan struct{}, 2)
		go func() { wsFromBackend(c, back); done <- struct{}{} }()
		go func() { wsToBackend(rw.Reader, c, back); done <- struct{}{} }()
		select {
		case <-done:
		case <-e.ctx.Done():
		}
	})
}

// wsFrame encodes one unmasked frame (websocket_proxy's $encode).
func wsFrame(opcode byte, payload []byte) []byte {
	b := []byte{0x80 | opcode}
	switch n := len(payload); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= 0xffff:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}

// wsFromBackend is the proxy handle's reader: what the port sends, as
// binary frames.
func wsFromBackend(c net.Conn, back net.Conn) {
	buf := make([]byte, wsMaxPayload)
	for {
		n, err := back.Read(buf)
		if n > 0 {
			if _, werr := c.Write(wsFrame(2, buf[:n])); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wsToBackend is the client handle's reader (hdlreader).
func wsToBackend(r *bufio.Reader, c net.Conn, back net.Conn) {
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		fin, rsv, opcode := hdr[0]&0x80 != 0, hdr[0]&0x70, hdr[0]&0x0f
		if !fin || rsv != 0 || hdr[1]&0x80 == 0 {
			return // fragmented, RSV flags or unmasked: dropped
		}
		n := uint64(hdr[1] & 0x7f)
		switch n {
		case 126:
			var l [2]byte
			if _, err := io.ReadFull(r, l[:]); err != nil {
				return
			}
			n = uint64(binary.BigEndian.Uint16(l[:]))
		case 127:
			var l [8]byte
			if _, err := io.ReadFull(r, l[:]); err != nil {
				return
			}
			n = binary.BigEndian.Uint64(l[:])
		}
		if n > wsMaxPayload {
			return // "received too large websocket frame"
		}
		var mask [4]byte
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, mask[:]); err != nil {
			return
		}
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
		switch opcode {
		case 1, 2:
			if _, err := back.Write(payload); err != nil {
				return
			}
		case 8:
			return
		case 9:
			c.Write(wsFrame(0xa, payload))
		case 0xa:
		default:
			return // "received unhandled websocket opcode"
		}
	}
}
