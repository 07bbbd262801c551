package qga

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// section is one file of a txtar archive.
type section struct {
	name string
	data []byte
}

// parseTxtar parses the txtar format (a comment, then "-- name --" lines
// each starting a section) and turns the text \xff into the byte 0xFF.
func parseTxtar(data []byte) []section {
	var out []section
	for _, line := range strings.SplitAfter(string(data), "\n") {
		trimmed := strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(trimmed, "-- ") && strings.HasSuffix(trimmed, " --") && len(trimmed) > 6 {
			out = append(out, section{name: strings.TrimSpace(trimmed[3 : len(trimmed)-3])})
			continue
		}
		if len(out) > 0 {
			out[len(out)-1].data = append(out[len(out)-1].data, strings.ReplaceAll(line, `\xff`, "\xff")...)
		}
	}
	return out
}

func TestGoldenSyncExec(t *testing.T) {
	raw, err := os.ReadFile("testdata/sync_exec.txtar")
	if err != nil {
		t.Fatal(err)
	}
	script := parseTxtar(raw)
	if len(script) != 8 {
		t.Fatalf("parseTxtar found %d sections; want 8", len(script))
	}
	client, agent := net.Pipe()
	done := make(chan error, 1)
	go func() {
		defer agent.Close()
		for i, s := range script {
			switch s.name {
			case "send":
				got := make([]byte, len(s.data))
				if _, err := io.ReadFull(agent, got); err != nil {
					done <- err
					return
				}
				if !bytes.Equal(got, s.data) {
					t.Errorf("section %d: client sent %q; want %q", i, got, s.data)
					done <- nil
					return
				}
			case "recv":
				if _, err := agent.Write(s.data); err != nil {
					done <- err
					return
				}
			default:
				t.Errorf("section %d: unknown name %q", i, s.name)
			}
		}
		done <- nil
	}()
	c := New("golden", WithDialer(func(context.Context) (net.Conn, error) { return client, nil }))
	defer c.Close()
	c.newID = func() int64 { return 1000 }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Exec(ctx, ExecRequest{Path: "echo", Args: []string{"hi"}})
	if err != nil || !st.Exited || st.ExitCode != 0 || string(st.Stdout) != "hi\n" || st.PID != 4242 {
		t.Errorf("Exec(echo hi) = %+v, %v; want pid 4242, exit 0, stdout %q", st, err, "hi\n")
	}
	if err := <-done; err != nil {
		t.Errorf("transcript: %v", err)
	}
}
