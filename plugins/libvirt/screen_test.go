package libvirt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
)

// fakeLibvirtd answers one RPC connection: auth list (none), connect open,
// and the screenshot call with the packets screenshot gives.
type fakeLibvirtd struct {
	authTypes  []uint32
	screenshot func(serial int32) [][]byte // packets after the call
	calls      []uint32                    // procedures called, in order
	last       []byte                      // the last packet's body
}

// streamed answers a console's input packet: it echoes the data, and
// ends the stream (an empty CONTINUE, then OK) on "exit\n".
func (f *fakeLibvirtd) streamed(serial int32, body []byte, conn net.Conn) {
	const proc = procDomainOpenConsole
	out := [][]byte{packet(proc, socket.Stream, socket.StatusContinue, serial, body)}
	if string(body) == "exit\n" {
		out = append(out, packet(proc, socket.Stream, socket.StatusContinue, serial, nil),
			packet(proc, socket.Stream, socket.StatusOK, serial, nil))
	}
	for _, p := range out {
		conn.Write(p)
	}
}

// pipeDialer hands out the client end of one in-memory connection.
type pipeDialer struct{ c net.Conn }

func (p pipeDialer) Dial() (net.Conn, error) { return p.c, nil }

func packet(proc uint32, typ, status uint32, serial int32, body []byte) []byte {
	var b bytes.Buffer
	for _, v := range []uint32{uint32(28 + len(body)), remoteProgram, 1, proc, typ, uint32(serial), status} {
		b.Write(binary.BigEndian.AppendUint32(nil, v))
	}
	b.Write(body)
	return b.Bytes()
}

func (f *fakeLibvirtd) serve(conn net.Conn) {
	defer conn.Close()
	for {
		head := make([]byte, 28)
		if _, err := io.ReadFull(conn, head); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head)
		proc := binary.BigEndian.Uint32(head[12:])
		serial := int32(binary.BigEndian.Uint32(head[20:]))
		f.last = make([]byte, int(n)-28)
		if _, err := io.ReadFull(conn, f.last); err != nil {
			return
		}
		typ := binary.BigEndian.Uint32(head[16:])
		if typ == socket.Stream {
			f.streamed(serial, f.last, conn)
			continue
		}
		f.calls = append(f.calls, proc)
		var out [][]byte
		switch proc {
		case procAuthList:
			var b bytes.Buffer
			xdrPutUint32(&b, uint32(len(f.authTypes)))
			for _, t := range f.authTypes {
				xdrPutUint32(&b, t)
			}
			out = [][]byte{packet(proc, socket.Reply, socket.StatusOK, serial, b.Bytes())}
		case procAuthPolkit, procConnectOpen:
			out = [][]byte{packet(proc, socket.Reply, socket.StatusOK, serial, nil)}
		case procDomainScreenshot:
			out = f.screenshot(serial)
		case procDomainOpenConsole:
			out = [][]byte{
				packet(proc, socket.Reply, socket.StatusOK, serial, nil),
				packet(proc, socket.Stream, socket.StatusContinue, serial, []byte("login: ")),
			}
		}
		for _, p := range out {
			if _, err := conn.Write(p); err != nil {
				return
			}
		}
	}
}

func mimeRet(mime string) []byte {
	var b bytes.Buffer
	xdrPutUint32(&b, 1)
	xdrPutString(&b, mime)
	return b.Bytes()
}

func remoteErr(code uint32, msg string) []byte {
	var b bytes.Buffer
	xdrPutUint32(&b, code)
	xdrPutUint32(&b, 10)
	xdrPutUint32(&b, 1)
	xdrPutString(&b, msg)
	xdrPutUint32(&b, 2)
	return b.Bytes()
}

// TestScreenshotStream runs screenshotStream against a fake libvirtd: the
// packet sequence that hangs go-libvirt's streams forever (an empty
// CONTINUE, then the closing OK) gives the image; a stream that stops
// sending is given up as stalled; remote errors come back as go-libvirt's
// Error with libvirt's message; polkit is done when the daemon asks.
func TestScreenshotStream(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nrest-of-the-image")
	const proc = procDomainScreenshot
	tests := []struct {
		name      string
		auth      []uint32
		packets   func(serial int32) [][]byte
		wantImg   []byte
		wantMime  string
		wantErr   error
		wantMsg   string
		wantCalls []uint32
		// stall is screenshotStream's stall limit: a minute (never
		// reached: a loaded machine may pause between two packets) where
		// the case does not wait it out.
		stall time.Duration
	}{
		{name: "empty continue then ok", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			return [][]byte{
				packet(proc, socket.Reply, socket.StatusOK, s, mimeRet("image/png")),
				packet(proc, socket.Stream, socket.StatusContinue, s, png[:5]),
				packet(proc, socket.Stream, socket.StatusContinue, s, png[5:]),
				packet(proc, socket.Stream, socket.StatusContinue, s, nil),
				packet(proc, socket.Stream, socket.StatusOK, s, nil),
			}
		}, wantImg: png, wantMime: "image/png", wantCalls: []uint32{procAuthList, procConnectOpen, proc}},
		{name: "ok ends, no mime, polkit", auth: []uint32{authPolkit}, packets: func(s int32) [][]byte {
			return [][]byte{
				packet(proc, socket.Reply, socket.StatusOK, s, binary.BigEndian.AppendUint32(nil, 0)),
				packet(proc, socket.Stream, socket.StatusContinue, s, png),
				packet(proc, socket.Stream, socket.StatusOK, s, nil),
			}
		}, wantImg: png, wantMime: "image/png", wantCalls: []uint32{procAuthList, procAuthPolkit, procConnectOpen, proc}},
		{name: "stream before the reply", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			// libvirtd's event loop may send a small image and its end
			// before the worker thread queues the call's reply.
			return [][]byte{
				packet(proc, socket.Stream, socket.StatusContinue, s, png[:5]),
				packet(proc, socket.Stream, socket.StatusContinue, s, png[5:]),
				packet(proc, socket.Stream, socket.StatusOK, s, nil),
				packet(proc, socket.Reply, socket.StatusOK, s, mimeRet("image/png")),
			}
		}, wantImg: png, wantMime: "image/png"},
		{name: "stream part before the reply", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			return [][]byte{
				packet(proc, socket.Stream, socket.StatusContinue, s, png[:5]),
				packet(proc, socket.Reply, socket.StatusOK, s, mimeRet("image/png")),
				packet(proc, socket.Stream, socket.StatusContinue, s, png[5:]),
				packet(proc, socket.Stream, socket.StatusOK, s, nil),
			}
		}, wantImg: png, wantMime: "image/png"},
		{name: "stalled", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			return [][]byte{
				packet(proc, socket.Reply, socket.StatusOK, s, mimeRet("image/png")),
				packet(proc, socket.Stream, socket.StatusContinue, s, png[:5]),
			}
		}, wantErr: errStreamStalled, stall: 100 * time.Millisecond},
		{name: "call refused", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			return [][]byte{packet(proc, socket.Reply, socket.StatusError, s, remoteErr(55, "Requested operation is not valid: domain is not running"))}
		}, wantMsg: "domain is not running"},
		{name: "stream aborted", auth: []uint32{authNone}, packets: func(s int32) [][]byte {
			return [][]byte{
				packet(proc, socket.Reply, socket.StatusOK, s, mimeRet("image/png")),
				packet(proc, socket.Stream, socket.StatusError, s, remoteErr(1, "internal error: screendump failed")),
			}
		}, wantMsg: "screendump failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			f := &fakeLibvirtd{authTypes: tt.auth, screenshot: tt.packets}
			done := make(chan struct{})
			go func() { defer close(done); f.serve(server) }()
			d := &Driver{streamDialer: pipeDialer{client}, ep: endpoint{name: "qemu:///system"}}
			dom := golibvirt.Domain{Name: "vm1", ID: 3}
			stall := tt.stall
			if stall == 0 {
				stall = time.Minute
			}
			mime, img, err := d.screenshotStream(context.Background(), dom, stall)
			<-done // the connection is closed when screenshotStream returns
			switch {
			case tt.wantErr != nil || tt.wantMsg != "":
				var lerr golibvirt.Error
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) ||
					tt.wantMsg != "" && (!errors.As(err, &lerr) || !bytes.Contains([]byte(lerr.Message), []byte(tt.wantMsg))) {
					t.Fatalf("screenshotStream() error = %v; want %v %q", err, tt.wantErr, tt.wantMsg)
				}
			case err != nil || mime != tt.wantMime || !bytes.Equal(img, tt.wantImg):
				t.Fatalf("screenshotStream() = %q, %q, %v; want %q, %q, nil", mime, img, err, tt.wantMime, tt.wantImg)
			}
			if tt.wantCalls != nil && !slices.Equal(f.calls, tt.wantCalls) {
				t.Errorf("procedures called = %v; want %v", f.calls, tt.wantCalls)
			}
		})
	}
}

// TestConsoleStream runs a console both ways over streamConn against the
// fake libvirtd: the guest's output and the echo of the input arrive in
// order, and the stream's end (the sequence go-libvirt hangs on) returns.
func TestConsoleStream(t *testing.T) {
	client, server := net.Pipe()
	f := &fakeLibvirtd{authTypes: []uint32{authNone}}
	served := make(chan struct{})
	go func() { defer close(served); f.serve(server) }()
	c, err := dialStream(context.Background(), pipeDialer{client}, "qemu:///system")
	if err != nil {
		t.Fatalf("dialStream() error: %v", err)
	}
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- c.DomainOpenConsoleBidirectional(golibvirt.Domain{Name: "vm1"}, nil, outR, inW, 0)
		inW.Close()
	}()
	var got bytes.Buffer
	read := make(chan error, 1)
	go func() { _, err := io.Copy(&got, inR); read <- err }()
	for _, line := range []string{"ls\n", "exit\n"} {
		if _, err := outW.Write([]byte(line)); err != nil {
			t.Fatalf("console input %q: %v", line, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("DomainOpenConsoleBidirectional() = %v; want nil at the stream's end", err)
	}
	<-read
	outR.CloseWithError(errors.New("closed")) // the sender goroutine's end, as console.go does
	c.Disconnect()
	<-served
	if want := "login: ls\nexit\n"; got.String() != want {
		t.Fatalf("console output = %q; want %q", got.String(), want)
	}
}
