package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAgent is an in-process agent on a unix socket. Its function fields
// decide what it writes; nil fields behave like qemu-ga.
type fakeAgent struct {
	// connect runs when a client connects, before anything is read (stale bytes).
	connect func(w io.Writer, conn int)
	// sync answers the n-th guest-sync-delimited (1-based) of a connection.
	sync func(w io.Writer, id int64, n int)
	// command answers any other command; it may close conn.
	command func(w io.Writer, conn net.Conn, cmd string, args json.RawMessage)

	sock  string
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex // mu guards the fields below.
	conns []net.Conn
	cmds  []string // every command received, syncs included
}

// qemuSync is what qemu-ga writes for our 0xFF and a sync: first the error
// reply caused by the stray 0xFF, then its own 0xFF and the reply.
func qemuSync(w io.Writer, id int64) {
	fmt.Fprintf(w, "{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON parse error, stray '\\\\uFFFD'\"}}\n\xff{\"return\": %d}\n", id)
}

func startFake(t *testing.T, f *fakeAgent) *Client {
	t.Helper()
	f.sock = filepath.Join(t.TempDir(), "qga.sock")
	ln, err := net.Listen("unix", f.sock)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	f.ln = ln
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	c := New(f.sock)
	t.Cleanup(func() { c.Close() })
	return c
}

func (f *fakeAgent) accept() {
	defer f.wg.Done()
	for n := 1; ; n++ {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, conn)
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(conn, n)
	}
}

func (f *fakeAgent) serve(conn net.Conn, n int) {
	defer f.wg.Done()
	defer conn.Close()
	if f.connect != nil {
		f.connect(conn, n)
	}
	rd := bufio.NewReader(conn)
	syncs := 0
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return
		}
		line = bytes.TrimLeft(line, "\xff")
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			fmt.Fprintf(conn, "{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON parse error\"}}\n")
			continue
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, req.Execute)
		f.mu.Unlock()
		if req.Execute == "guest-sync-delimited" {
			var a struct{ ID int64 }
			json.Unmarshal(req.Arguments, &a)
			syncs++
			if f.sync != nil {
				f.sync(conn, a.ID, syncs)
			} else {
				qemuSync(conn, a.ID)
			}
			continue
		}
		if f.command == nil {
			fmt.Fprintf(conn, "{\"return\": {}}\n")
			continue
		}
		f.command(conn, conn, req.Execute, req.Arguments)
	}
}

func (f *fakeAgent) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.cmds...)
}

func (f *fakeAgent) count(cmd string) int {
	n := 0
	for _, c := range f.commands() {
		if c == cmd {
			n++
		}
	}
	return n
}

// versionReply answers guest-info with version v.
func versionReply(v string) func(io.Writer, net.Conn, string, json.RawMessage) {
	return func(w io.Writer, _ net.Conn, cmd string, _ json.RawMessage) {
		b, _ := json.Marshal(map[string]any{"return": map[string]any{"version": v, "supported_commands": []any{}}})
		w.Write(append(b, '\n'))
	}
}

func TestFramingSync(t *testing.T) {
	tests := []struct {
		name    string
		connect func(io.Writer, int)
		sync    func(io.Writer, int64, int)
	}{
		{name: "qemu-ga behaviour"},
		{name: "stale bytes before the delimiter", connect: func(w io.Writer, _ int) {
			io.WriteString(w, "{\"return\": {\"version\": \"stale\"}}\n{\"return\": {\"vers")
		}},
		{name: "stale replies with old ids after the delimiter", sync: func(w io.Writer, id int64, _ int) {
			fmt.Fprintf(w, "\xff{\"return\": %d}\n{\"return\": {\"version\": \"stale\"}}\n{\"error\": {\"class\": \"GenericError\", \"desc\": \"x\"}}\n\n{\"return\": %d}\n", id-1, id)
		}},
		{name: "garbage and a second delimiter on one line", sync: func(w io.Writer, id int64, _ int) {
			fmt.Fprintf(w, "\xffnot json\xff{\"return\": %d}\n", id)
		}},
		{name: "agent answers only later syncs (booting)", sync: func(w io.Writer, id int64, n int) {
			if n < 3 {
				return // queued; answered below in order, as a booting agent does
			}
			for i := n - 1; i >= 1; i-- {
				fmt.Fprintf(w, "\xff{\"return\": %d}\n", id-int64(i)*1000)
			}
			qemuSync(w, id)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAgent{connect: tt.connect, sync: tt.sync, command: versionReply("9.9.9")}
			c := startFake(t, f)
			ids := int64(0)
			c.newID = func() int64 { ids += 1000; return ids }
			info, err := c.Info(testCtx(t, 10*time.Second))
			if err != nil || info.Version != "9.9.9" {
				t.Fatalf("Info() = %q, %v; want 9.9.9", info.Version, err)
			}
			if got := f.count("guest-info"); got != 1 {
				t.Errorf("guest-info sent %d times; want 1", got)
			}
		})
	}
}

func TestFramingReplies(t *testing.T) {
	big := strings.Repeat("v", 200<<10) // a reply well over 64 KiB
	tests := []struct {
		name    string
		command func(io.Writer, net.Conn, string, json.RawMessage)
		want    string
	}{
		{name: "split across reads", want: "1.2.3", command: func(w io.Writer, _ net.Conn, _ string, _ json.RawMessage) {
			reply := `{"return": {"version": "1.2.3", "supported_commands": []}}` + "\n"
			for i := 0; i < len(reply); i += 7 {
				io.WriteString(w, reply[i:min(i+7, len(reply))])
				time.Sleep(time.Millisecond)
			}
		}},
		{name: "larger than 64 KiB", want: big, command: versionReply(big)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startFake(t, &fakeAgent{command: tt.command})
			info, err := c.Info(testCtx(t, 10*time.Second))
			if err != nil || info.Version != tt.want {
				t.Errorf("Info() = %d-byte version, %v; want %d bytes", len(info.Version), err, len(tt.want))
			}
		})
	}
}

func TestFramingFailuresReconnect(t *testing.T) {
	tests := []struct {
		name    string
		bad     func(w io.Writer, conn net.Conn)
		wantErr error
	}{
		{name: "dropped mid-reply", wantErr: ErrConnLost, bad: func(w io.Writer, conn net.Conn) {
			io.WriteString(w, `{"return": {"vers`)
			conn.Close()
		}},
		{name: "malformed reply", wantErr: ErrProtocol, bad: func(w io.Writer, _ net.Conn) {
			io.WriteString(w, "{\"return\": {\"version\": 1.2.3}}\n")
		}},
		{name: "neither return nor error", wantErr: ErrProtocol, bad: func(w io.Writer, _ net.Conn) {
			io.WriteString(w, "{\"QMP\": {}}\n")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			f := &fakeAgent{command: func(w io.Writer, conn net.Conn, cmd string, a json.RawMessage) {
				mu.Lock()
				calls++
				first := calls == 1
				mu.Unlock()
				if first {
					tt.bad(w, conn)
					return
				}
				versionReply("2.0")(w, conn, cmd, a)
			}}
			c := startFake(t, f)
			ctx := testCtx(t, 10*time.Second)
			if _, err := c.Info(ctx); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Info() with a bad reply: error %v; want %v", err, tt.wantErr)
			}
			info, err := c.Info(ctx)
			if err != nil || info.Version != "2.0" {
				t.Fatalf("Info() after the failure = %q, %v; want 2.0", info.Version, err)
			}
			if got := f.count("guest-sync-delimited"); got != 2 {
				t.Errorf("syncs = %d; want 2 (a reconnect and resync after the failure)", got)
			}
		})
	}
}

func TestTimeouts(t *testing.T) {
	silent := func(io.Writer, net.Conn, string, json.RawMessage) {}
	tests := []struct {
		name     string
		f        *fakeAgent
		minSyncs int
	}{
		{name: "command never answered", f: &fakeAgent{command: silent}, minSyncs: 1},
		{name: "sync never answered", f: &fakeAgent{sync: func(io.Writer, int64, int) {}}, minSyncs: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startFake(t, tt.f)
			const d = 400 * time.Millisecond
			start := time.Now() // before the context, whose deadline counts from its creation
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			err := c.Ping(ctx)
			el := time.Since(start)
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Ping() error %v; want ErrTimeout wrapping context.DeadlineExceeded", err)
			}
			if el < d || el > d+5*time.Second {
				t.Errorf("Ping() returned after %v; want soon after its %v deadline", el, d)
			}
			if got := tt.f.count("guest-sync-delimited"); got < tt.minSyncs {
				t.Errorf("syncs sent = %d; want at least %d", got, tt.minSyncs)
			}
		})
	}
}

func TestDefaultCallTimeout(t *testing.T) {
	f := &fakeAgent{command: func(io.Writer, net.Conn, string, json.RawMessage) {}}
	startFake(t, f)
	c := New(f.sock, WithCallTimeout(200*time.Millisecond))
	defer c.Close()
	if err := c.Ping(context.Background()); !errors.Is(err, ErrTimeout) {
		t.Errorf("Ping(no deadline) error %v; want ErrTimeout from the default call timeout", err)
	}
}

func TestErrorReplies(t *testing.T) {
	f := &fakeAgent{command: func(w io.Writer, _ net.Conn, cmd string, _ json.RawMessage) {
		switch cmd {
		case "guest-exec":
			io.WriteString(w, `{"error": {"class": "CommandNotFound", "desc": "Command guest-exec has been disabled"}}`+"\n")
		case "guest-exec-status":
			io.WriteString(w, `{"error": {"class": "GenericError", "desc": "Invalid parameter 'pid'"}}`+"\n")
		default:
			io.WriteString(w, `{"error": {"class": "GenericError", "desc": "boom"}}`+"\n")
		}
	}}
	c := startFake(t, f)
	ctx := testCtx(t, 10*time.Second)
	var de *DisabledError
	if _, err := c.ExecStart(ctx, ExecRequest{Path: "true"}); !errors.As(err, &de) || de.Command != "guest-exec" {
		t.Errorf("ExecStart() error %v; want *DisabledError{guest-exec}", err)
	}
	if _, err := c.ExecStatus(ctx, 42, 0); !errors.Is(err, ErrUnknownExec) {
		t.Errorf("ExecStatus(42) error %v; want ErrUnknownExec", err)
	}
	var e *Error
	if err := c.Ping(ctx); !errors.As(err, &e) || e.Class != "GenericError" || e.Desc != "boom" {
		t.Errorf("Ping() error %v; want *Error{GenericError boom}", err)
	}
	if got := f.count("guest-sync-delimited"); got != 1 {
		t.Errorf("syncs = %d; want 1 (an error reply keeps the connection)", got)
	}
}

func TestNoAgent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	for _, tt := range []struct{ name, path, want string }{
		{"missing", filepath.Join(dir, "missing.sock"), "no such socket"},
		{"not a socket", file, "not a socket"},
		{"nothing listening", stale, "connection refused"},
		{"directory", dir, "not a socket"},
	} {
		c := New(tt.path)
		err := c.Ping(testCtx(t, 5*time.Second))
		c.Close()
		if !errors.Is(err, ErrNoAgent) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Ping(%s) error %v; want ErrNoAgent saying %q", tt.name, err, tt.want)
		}
	}
}

func TestClose(t *testing.T) {
	f := &fakeAgent{command: func(io.Writer, net.Conn, string, json.RawMessage) {}}
	c := startFake(t, f)
	errc := make(chan error, 1)
	go func() { errc <- c.Ping(testCtx(t, 30*time.Second)) }()
	for f.count("guest-ping") == 0 {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Ping() interrupted by Close: error %v; want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not interrupt a call in progress")
	}
	if err := c.Ping(testCtx(t, time.Second)); !errors.Is(err, ErrClosed) {
		t.Errorf("Ping() after Close: error %v; want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close() = %v; want nil", err)
	}
}

func TestShutdown(t *testing.T) {
	tests := []struct {
		name    string
		mode    string
		answer  func(w io.Writer, conn net.Conn)
		wantErr error
		sent    int
	}{
		{name: "agent goes away", mode: "powerdown", answer: func(_ io.Writer, conn net.Conn) { conn.Close() }, sent: 1},
		{name: "agent stays silent", mode: "reboot", answer: func(io.Writer, net.Conn) {}, sent: 1},
		{name: "error reply", mode: "halt", wantErr: &Error{}, sent: 1, answer: func(w io.Writer, _ net.Conn) {
			io.WriteString(w, `{"error": {"class": "GenericError", "desc": "nope"}}`+"\n")
		}},
		{name: "bad mode", mode: "powerdown; reboot", wantErr: ErrInvalidArgument},
		{name: "empty mode", mode: "", wantErr: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAgent{command: func(w io.Writer, conn net.Conn, cmd string, _ json.RawMessage) {
				if cmd == "guest-shutdown" {
					tt.answer(w, conn)
				}
			}}
			c := startFake(t, f)
			start := time.Now()
			err := c.Shutdown(testCtx(t, 30*time.Second), tt.mode)
			switch want := tt.wantErr.(type) {
			case nil:
				if err != nil {
					t.Errorf("Shutdown(%q) = %v; want nil", tt.mode, err)
				}
			case *Error:
				if !errors.As(err, &want) {
					t.Errorf("Shutdown(%q) = %v; want a *Error", tt.mode, err)
				}
			default:
				if !errors.Is(err, want) {
					t.Errorf("Shutdown(%q) = %v; want %v", tt.mode, err, want)
				}
			}
			if el := time.Since(start); el > ShutdownWait+10*time.Second {
				t.Errorf("Shutdown(%q) took %v; want about ShutdownWait", tt.mode, el)
			}
			if got := f.count("guest-shutdown"); got != tt.sent {
				t.Errorf("guest-shutdown sent %d times; want %d", got, tt.sent)
			}
		})
	}
}
