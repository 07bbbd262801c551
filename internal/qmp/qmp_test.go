package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
		{"a second greeting skipped", []string{`{"QMP": {"version": {}, "capabilities": ["oob"]}}`, `{"return": {"status": "paused"}}`}, `{"status": "paused"}`, ""},
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

// TestAttach: a node QEMU has is used as it is; a missing one is added
// from File, which needs qemu-img to be made; without File it is
// ErrNoNode.
func TestAttach(t *testing.T) {
	_, errImg := exec.LookPath("qemu-img")
	cases := []struct {
		name    string
		node    string
		file    bool
		path    string // PATH; "" keeps the test's
		wantErr error
		wantAdd bool // blockdev-add sent
		skip    bool
	}{
		{name: "the VM's disk", node: "disk0"},
		{name: "no such node", node: "state", wantErr: ErrNoNode},
		{name: "no qemu-img", node: "state", file: true, path: "/nonexistent", wantErr: ErrNoQemuImg},
		{name: "state image made and added", node: "state", file: true, wantAdd: true, skip: errImg != nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.skip {
				if os.Getenv("VMGATE_REQUIRE_VM") != "" {
					t.Fatal("VMGATE_REQUIRE_VM is set but qemu-img is not installed (qemu-utils)")
				}
				t.Skip("qemu-img is not installed (qemu-utils)")
			}
			if c.path != "" {
				t.Setenv("PATH", c.path)
			}
			var mu sync.Mutex
			var asked []string
			sock := fakeMonitor(t, func(cmd map[string]any) []string {
				mu.Lock()
				asked = append(asked, cmd["execute"].(string))
				mu.Unlock()
				return []string{`{"return": [{"node-name": "disk0"}]}`}
			})
			img := StateImage{Socket: sock, Node: c.node}
			if c.file {
				img.File = filepath.Join(t.TempDir(), "state.qcow2")
			}
			err := img.Attach(t.Context())
			mu.Lock()
			defer mu.Unlock()
			added := slices.Contains(asked, "blockdev-add")
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) || added != c.wantAdd {
				t.Errorf("Attach() = %v after %v; want %v, blockdev-add sent: %v", err, asked, c.wantErr, c.wantAdd)
			}
			if c.wantAdd {
				if _, err := os.Stat(img.File); err != nil {
					t.Errorf("state image: %v; want it made", err)
				}
			}
		})
	}
}
