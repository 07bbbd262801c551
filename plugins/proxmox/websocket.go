package proxmox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// A websocket to Proxmox's vncwebsocket endpoint (qemu-server
// src/PVE/API2/Qemu.pm vncwebsocket; pve-http-server AnyEvent.pm
// websocket_proxy): the API's TLS settings and token, the ticket and port
// a vncproxy or termproxy call handed out. pveproxy relays the bytes of the
// port as binary frames both ways; wsStream makes them a byte stream.

// wsHandshakeTimeout bounds the websocket's opening.
const wsHandshakeTimeout = 15 * time.Second

// dialVNCWebsocket opens vmPath's vncwebsocket for ticket and port.
func (a *api) dialVNCWebsocket(ctx context.Context, vmPath string, port int, ticket string) (*wsStream, error) {
	u := *a.base
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	u.Path += vmPath + "/vncwebsocket"
	u.RawQuery = url.Values{"port": {strconv.Itoa(port)}, "vncticket": {ticket}}.Encode()
	dialer := websocket.Dialer{
		TLSClientConfig:  a.tls.Clone(),
		HandshakeTimeout: wsHandshakeTimeout,
		Subprotocols:     []string{"binary"}, // as noVNC and xterm.js ask
		ReadBufferSize:   64 << 10,
		WriteBufferSize:  16 << 10,
	}
	h := http.Header{"Authorization": {a.authz}}
	c, resp, err := dialer.DialContext(ctx, u.String(), h)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("vncwebsocket: %s: %w", resp.Status, err)
		}
		return nil, fmt.Errorf("vncwebsocket: %w", err)
	}
	c.SetReadLimit(1 << 20)
	return &wsStream{c: c}, nil
}

// wsStream is a websocket's binary messages as one byte stream. Read is
// for one goroutine at a time; Write is safe for concurrent use.
type wsStream struct {
	c   *websocket.Conn
	r   io.Reader // the message being read
	wmu sync.Mutex
}

func (s *wsStream) Read(p []byte) (int, error) {
	for {
		if s.r == nil {
			_, r, err := s.c.NextReader()
			if err != nil {
				return 0, err
			}
			s.r = r
		}
		n, err := s.r.Read(p)
		if err == io.EOF {
			s.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (s *wsStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// SetDeadline bounds reads and writes (the zero time: none).
func (s *wsStream) SetDeadline(t time.Time) {
	s.c.SetReadDeadline(t)
	s.wmu.Lock()
	s.c.SetWriteDeadline(t)
	s.wmu.Unlock()
}

// Close closes the websocket at once.
func (s *wsStream) Close() error { return s.c.Close() }
