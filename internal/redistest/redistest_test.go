package redistest

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestStartStopRestart(t *testing.T) {
	addr, stop, restart := Start(t)
	if err := ping(addr, ""); err != nil {
		t.Fatalf("ping(%s) after Start = %v; want nil", addr, err)
	}
	stop()
	if err := ping(addr, ""); err == nil {
		t.Fatalf("ping(%s) after stop = nil; want an error", addr)
	}
	stop() // harmless
	restart()
	if err := ping(addr, ""); err != nil {
		t.Fatalf("ping(%s) after restart = %v; want nil", addr, err)
	}
}

// fakeRedis answers every connection's first command with reply.
func fakeRedis(t *testing.T, reply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
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
			buf := make([]byte, 64)
			c.Read(buf)
			c.Write([]byte(reply))
			c.Close()
		}
	}()
	return l.Addr().String()
}

// TestServedBy: a server counts only when it is the process the test
// started, so a port another run's server took is never shared.
func TestServedBy(t *testing.T) {
	info := func(pid int) string {
		body := fmt.Sprintf("# Server\r\nredis_version:7.0.15\r\nprocess_id:%d\r\ntcp_port:6379\r\n", pid)
		return fmt.Sprintf("$%d\r\n%s\r\n", len(body), body)
	}
	tests := []struct {
		name, reply string
		want        string // "" for nil, else a part of the error
	}{
		{"ours", info(4242), ""},
		{"another run's", info(777), "another process's server (pid 777, not 4242)"},
		{"no pid", "$5\r\nhello\r\n", "no process_id"},
		{"not redis", "HTTP/1.1 400 Bad Request\r\n", "answered"},
	}
	for _, tc := range tests {
		err := servedBy(fakeRedis(t, tc.reply), "", 4242)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("servedBy(%s) = %v; want %q", tc.name, err, tc.want)
		}
	}
}
