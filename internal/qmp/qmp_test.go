package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeMonitor serves one QMP client on a unix socket: the greeting, then
// for each command line the lines reply returns for it.
func fakeMonitor(t *testing.T, reply func(cmd map[string]any) []string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					var cmd map[string]any
					if json.Unmarshal(line, &cmd) != nil {
						return
					}
					if cmd["execute"] == "qmp_capabilities" {
						c.Write([]byte(`{"return": {}}` + "\n"))
						continue
					}
					for _, l := range reply(cmd) {
						c.Write([]byte(l + "\n"))
					}
				}
			}()
		}
	}()
	return sock
}

func TestCall(t *testing.T) {
	cases := []struct {
		name    string
		lines   []string
		want    string
		wantErr string
	}{
		{"return", []string{`{"return": {"status": "running"}}`}, `{"status": "running"}`, ""},
		{"events skipped", []string{`{"event": "STOP", "timestamp": {}}`, `{"return": []}`}, `[]`, ""},
		{"error reply", []string{`{"error": {"class": "GenericError", "desc": "no such node"}}`}, "", "no such node"},
		{"not JSON", []string{`garbage`}, "", "bad reply"},
		{"neither", []string{`{"id": 1}`}, "", "reply without return"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got map[string]any
			sock := fakeMonitor(t, func(cmd map[string]any) []string { got = cmd; return c.lines })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			raw, err := Call(ctx, sock, "query-status", map[string]any{"flat": true})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Call() = %s, %v; want an error containing %q", raw, err, c.wantErr)
				}
				return
			}
			if err != nil || string(raw) != c.want {
				t.Fatalf("Call() = %s, %v; want %s", raw, err, c.want)
			}
			if got["execute"] != "query-status" || got["arguments"].(map[string]any)["flat"] != true {
				t.Errorf("command sent = %v; want query-status with flat=true", got)
			}
		})
	}
}

// TestCallErrorType: an error reply is an *Error with QEMU's class.
func TestCallErrorType(t *testing.T) {
	sock := fakeMonitor(t, func(map[string]any) []string {
		return []string{`{"error": {"class": "CommandNotFound", "desc": "The command x has not been found"}}`}
	})
	_, err := Call(t.Context(), sock, "x", nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Errorf("Call(x) = %v; want *Error of class CommandNotFound", err)
	}
}

// TestCallCancel: a monitor that never answers holds the call only until
// its context ends.
func TestCallCancel(t *testing.T) {
	received := make(chan struct{})
	sock := fakeMonitor(t, func(map[string]any) []string { close(received); return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := Call(ctx, sock, "query-status", nil); done <- err }()
	<-received // the command is with QEMU, which does not answer
	cancel()
	if err := <-done; err == nil {
		t.Errorf("Call() after cancel = nil; want an error")
	}
}

// TestAttachWithoutQemuImg: a missing image and no qemu-img is
// ErrNoQemuImg, before QEMU is asked anything.
func TestAttachWithoutQemuImg(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	asked := false
	sock := fakeMonitor(t, func(map[string]any) []string { asked = true; return []string{`{"return": []}`} })
	img := StateImage{Socket: sock, Node: "n", File: filepath.Join(t.TempDir(), "state.qcow2")}
	if err := img.Attach(t.Context()); !errors.Is(err, ErrNoQemuImg) || asked {
		t.Errorf("Attach() without qemu-img = %v (QEMU asked: %v); want %v, QEMU not asked", err, asked, ErrNoQemuImg)
	}
}
