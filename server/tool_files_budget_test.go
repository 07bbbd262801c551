package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
)

// stagingGuest is a guest whose file /tmp/big holds data, answering
// vmgate-guest's file read with its data output in staging pieces of
// wire.PieceCap (as --out auto does past wire.InlineMax) and taking a
// write's data in the pieces the host stages; the driver's file channel
// moves the pieces.
type stagingGuest struct {
	data []byte
	// noted, when set, paces the pieces: each piece of a command but its
	// first waits for a token (the test sends one per progress
	// notification it read), so every piece's notification is seen.
	noted chan struct{}

	mu     sync.Mutex
	pieces map[string][]byte // staging path -> content
	n      int
	moved  int // pieces moved in the current command
}

// fresh starts a command's pieces: no token of an earlier one counts.
func (g *stagingGuest) fresh() {
	g.moved = 0
	for g.noted != nil && len(g.noted) > 0 {
		<-g.noted
	}
}

// piece waits, for every piece of a command but its first, for a token.
func (g *stagingGuest) piece(ctx context.Context) error {
	g.mu.Lock()
	g.moved++
	wait := g.moved > 1 && g.noted != nil
	g.mu.Unlock()
	if !wait {
		return nil
	}
	select {
	case <-g.noted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *stagingGuest) stagePath() string {
	g.n++
	return fmt.Sprintf("/var/lib/vmgate/xfer/x-%032x", g.n)
}

// file answers vmgate-guest file … (the fake guest took --out off argv).
func (g *stagingGuest) file(argv []string, stdin []byte) hypervisor.ExecResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch argv[2] {
	case "stat":
		return reply(wire.FileInfo{Path: flag(argv, "--path"), Exists: true, Type: "file", Mode: 0o644})
	case "stage":
		g.fresh()
		n, _ := strconv.Atoi(flag(argv, "--count"))
		made := make([]wire.FileInfo, n)
		for j := range made {
			made[j] = wire.FileInfo{Path: g.stagePath(), Exists: true, Type: "file", Mode: 0o600}
		}
		return reply(made)
	case "unstage":
		return reply(map[string]int{"removed": strings.Count(strings.Join(argv, " "), "--path")})
	case "write":
		size, _ := strconv.ParseInt(flag(argv, "--size"), 10, 64)
		return reply(wire.FileWritten{FileInfo: wire.FileInfo{Path: flag(argv, "--path"), Exists: true, Type: "file", Mode: 0o644}, Bytes: size, Created: true, Atomic: true})
	case "read":
		off, _ := strconv.ParseInt(flag(argv, "--offset"), 10, 64)
		n, _ := strconv.ParseInt(flag(argv, "--length"), 10, 64)
		end := min(off+n, int64(len(g.data)))
		data := g.data[min(off, end):end]
		fr := wire.FileRead{FileInfo: wire.FileInfo{Path: flag(argv, "--path"), Exists: true, Type: "file", Mode: 0o644, Size: int64(len(g.data))},
			Bytes: int64(len(data)), Offset: off, Truncated: end < int64(len(g.data)), EOF: end >= int64(len(g.data))}
		out := &wire.DataOut{Bytes: int64(len(data))}
		g.fresh()
		for j := 0; len(data) > 0; j++ {
			k := min(int64(len(data)), wire.PieceCap(j))
			p := g.stagePath()
			g.pieces[p] = data[:k]
			out.Staged = append(out.Staged, wire.Piece{Path: p, Bytes: k})
			data = data[k:]
		}
		b, _ := json.Marshal(wire.Reply{OK: true, Result: fr, Data: out})
		return hypervisor.ExecResult{Exited: true, Stdout: b}
	}
	return replyErr(wire.CodeInvalid, "", "unknown file command")
}

func (g *stagingGuest) fileRead(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
	if err := g.piece(ctx); err != nil {
		return hypervisor.FileContent{}, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.pieces[path]
	if !ok {
		return hypervisor.FileContent{}, fmt.Errorf("no staging file %s", path)
	}
	return hypervisor.FileContent{Data: b}, nil
}

func newStagingFixture(t *testing.T, data []byte, noted chan struct{}) *sessFixture {
	t.Helper()
	f := newSessFixture(t, haveBins(), "")
	g := &stagingGuest{data: data, noted: noted, pieces: map[string][]byte{}}
	f.guest.file = g.file
	d := f.s.backends["lab"].(*hypervisortest.Fake)
	d.FileReadFunc = g.fileRead
	d.FileWriteFunc = func(ctx context.Context, vm, path string, data []byte, mode uint32) error { return g.piece(ctx) }
	return f
}

// TestFileProgressByBytes: a vm_file_read and a vm_file_write whose data
// moves in staging pieces, over stdio with a progress token, get progress
// notifications in bytes — progress increasing, total the data's size —
// before their results.
func TestFileProgressByBytes(t *testing.T) {
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 5<<20/4) // 5 MiB of binary: two pieces out
	noted := make(chan struct{}, 64)
	f := newStagingFixture(t, data, noted)
	f.s.progressEvery = time.Hour // only pieces report
	send, lines := stdioPipe(t, f.s, "alice")
	type note struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
		Params struct {
			ProgressToken any     `json:"progressToken"`
			Progress      float64 `json:"progress"`
			Total         float64 `json:"total"`
		} `json:"params"`
	}
	// readUntil reads up to the response with id and, when token is set,
	// the notification of the token's whole total (stop sends it; it may
	// follow the response, which does not wait for the notification
	// queue), returning the token's progress notifications.
	readUntil := func(id, token string, total float64) ([]note, string) {
		t.Helper()
		var seen []note
		res := ""
		for lines.Scan() {
			var m note
			if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
				t.Fatalf("message %.200q: %v", lines.Bytes(), err)
			}
			if string(m.ID) == id {
				res = lines.Text()
			}
			if m.Method == "notifications/progress" && m.Params.ProgressToken == token {
				seen = append(seen, m)
				noted <- struct{}{}
			}
			if res != "" && (token == "" || len(seen) > 0 && seen[len(seen)-1].Params.Progress == total) {
				return seen, res
			}
		}
		t.Fatalf("no response with id %s and progress %v for %q (notifications %+v): %v", id, total, token, seen, lines.Err())
		return nil, ""
	}
	send(mcptest.InitMsg)
	readUntil("1", "", 0)
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	write := base64.StdEncoding.EncodeToString(data[:5<<20]) // two pieces in
	for _, c := range []struct {
		id, token, args string
		total           float64
	}{
		{"2", "tok-r", `{"name":"vm_file_read","arguments":{"vm":"lab/vm1","path":"/tmp/big","length":5242880},"_meta":{"progressToken":"tok-r"}}`, 5 << 20},
		{"3", "tok-w", `{"name":"vm_file_write","arguments":{"vm":"lab/vm1","path":"/tmp/new","content_base64":"` + write + `"},"_meta":{"progressToken":"tok-w"}}`, 5 << 20},
	} {
		send(`{"jsonrpc":"2.0","id":` + c.id + `,"method":"tools/call","params":` + c.args + `}`)
		seen, res := readUntil(c.id, c.token, c.total)
		if !strings.Contains(res, `"isError":false`) && strings.Contains(res, `"isError"`) {
			t.Fatalf("call %s = %.300s; want success", c.id, res)
		}
		if len(seen) < 2 {
			t.Fatalf("call %s: %d progress notifications (%+v); want one per piece (2)", c.id, len(seen), seen)
		}
		for i, p := range seen {
			if p.Params.Total != c.total || p.Params.Progress > c.total {
				t.Errorf("call %s notification %d = %v of %v; want progress within a total of %v bytes", c.id, i, p.Params.Progress, p.Params.Total, c.total)
			}
			if i > 0 && p.Params.Progress <= seen[i-1].Params.Progress {
				t.Errorf("call %s notification %d progress %v after %v; want increasing", c.id, i, p.Params.Progress, seen[i-1].Params.Progress)
			}
		}
	}
}

// TestFileResultsFitOneMessage: a read asking for more than one message
// carries (a 16 MiB range, base64 or text that JSON escapes six-fold)
// comes back in a message within the limit, truncated, saying where to
// read on; the next range starts there. At the boundary: a range that
// just fits comes back whole.
func TestFileResultsFitOneMessage(t *testing.T) {
	limit := catalog.DefaultLimits().MaxMessageBytes
	binary := bytes.Repeat([]byte{0, 0xfe, 7}, 16<<20/3)
	html := bytes.Repeat([]byte("<a&b>"), 16<<20/5) // \u003c … : six bytes each in JSON
	fitting := int64(limit-64<<10) / 4 * 3          // tools.base64Budget(resultBudget)
	tests := []struct {
		name   string
		data   []byte
		length int64
		whole  bool
	}{
		{"16 MiB of binary", binary, 16 << 20, false},
		{"16 MiB of escaped text", html, 16 << 20, false},
		{"binary that just fits", binary, fitting, true},
		{"binary one byte over", binary, fitting + 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newStagingFixture(t, tc.data, nil)
			raw := mcptest.ToolCall(1, "vm_file_read", fmt.Sprintf(`{"vm":"lab/vm1","path":"/tmp/big","length":%d}`, tc.length))
			out := f.s.Handle(context.Background(), &Conn{Grant: f.s.grants["alice"], Transport: "stdio"}, []byte(raw))
			if len(out) > limit {
				t.Fatalf("vm_file_read(length %d) answered %d bytes; want at most the message limit %d", tc.length, len(out), limit)
			}
			var r mcptest.Reply
			if err := json.Unmarshal(out, &r); err != nil || r.Result == nil || r.Result.IsError {
				t.Fatalf("vm_file_read(length %d) = %.300s, %v; want success", tc.length, out, err)
			}
			sc := r.Result.StructuredContent
			n := int64(sc["bytes"].(float64))
			switch {
			case tc.whole && (n != tc.length || sc["truncated"] != true):
				t.Errorf("bytes %d, truncated %v; want all %d (the file goes on)", n, sc["truncated"], tc.length)
			case !tc.whole && (n >= tc.length || n < int64(limit)/16 || sc["truncated"] != true || sc["eof"] != false):
				t.Errorf("bytes %d, truncated %v, eof %v; want a shorter range (but not a tiny one), truncated", n, sc["truncated"], sc["eof"])
			case !tc.whole && !strings.Contains(r.Text(), fmt.Sprintf("read on with offset %d", n)) || !tc.whole && !strings.Contains(r.Text(), "message limit"):
				t.Errorf("text %.300q; want it to say the message limit and where to read on (%d)", r.Text(), n)
			}
			got := []byte(fmt.Sprint(sc["content"]))
			if b64, ok := sc["content_base64"].(string); ok {
				got, _ = base64.StdEncoding.DecodeString(b64)
			}
			if !bytes.Equal(got, tc.data[:n]) {
				t.Errorf("content is not the file's first %d bytes", n)
			}
		})
	}
}

// TestArchiveReadFitsOneMessage: vm_archive_read returns a tar only when
// its result fits one message. Without gzip the guest is asked for no more
// content than that (--max-bytes); a tar that fits in content but not with
// its headers, and the guest's refusal of more content, are refused saying
// how to take the tree in parts. With gzip the policy's cap stays (the tar
// may shrink); a small tree comes back within the limit.
func TestArchiveReadFitsOneMessage(t *testing.T) {
	limit := catalog.DefaultLimits().MaxMessageBytes
	fitting := int64(limit-64<<10) / 4 * 3
	files := func(n int) []byte { // n files of 4 KiB
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := range n {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%d", i), Size: 4 << 10, Mode: 0o644})
			tw.Write(make([]byte, 4<<10))
		}
		tw.Close()
		return buf.Bytes()
	}
	big := files(1500) // 6 MB of content, 6.9 MB of tar
	overCap := func(argv []string, stdin []byte) hypervisor.ExecResult {
		return replyErr(wire.CodeRefused, wire.ReasonLimit, "archive read: refused: /srv/out is over the archive's limits: f7 takes the content past "+flag(argv, "--max-bytes")+" bytes (ask for a subdirectory or larger limits)")
	}
	tests := []struct {
		name, args string
		guest      func([]string, []byte) hypervisor.ExecResult
		maxBytes   string // what the guest was asked for
		ok         bool
	}{
		{"a tar over the message", `{"vm":"lab/vm1","path":"/srv/out"}`, guestArchive(big), strconv.FormatInt(fitting, 10), false},
		{"content over the message", `{"vm":"lab/vm1","path":"/srv/out"}`, overCap, strconv.FormatInt(fitting, 10), false},
		{"gzip keeps the policy's cap", `{"vm":"lab/vm1","path":"/srv/out","gzip":true}`, guestArchive(big), strconv.Itoa(64 << 20), false},
		{"a small tree", `{"vm":"lab/vm1","path":"/srv/out"}`, guestArchive(files(100)), strconv.FormatInt(fitting, 10), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSessFixture(t, haveBins(), "")
			f.guest.file = tc.guest
			raw := mcptest.ToolCall(1, "vm_archive_read", tc.args)
			out := f.s.Handle(context.Background(), &Conn{Grant: f.s.grants["alice"], Transport: "stdio"}, []byte(raw))
			if len(out) > limit {
				t.Fatalf("vm_archive_read answered %d bytes; want at most the message limit %d", len(out), limit)
			}
			var r mcptest.Reply
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatal(err)
			}
			if got := flag(lastArgv(f, "archive"), "--max-bytes"); got != tc.maxBytes {
				t.Errorf("the guest was asked for --max-bytes %s; want %s", got, tc.maxBytes)
			}
			if tc.ok {
				if r.Result == nil || r.Result.IsError {
					t.Errorf("vm_archive_read = %.300q; want the tar", r.Text())
				}
				return
			}
			for _, says := range []string{"more than one result carries", "subdirectories one at a time"} {
				if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), says) {
					t.Errorf("vm_archive_read = %.300q; want %s saying %q", r.Text(), TagInvalid, says)
				}
			}
		})
	}
}

// TestTooLargeWriteSaysHow: a vm_file_write or vm_archive_write message
// over the message limit is refused saying how the data goes in messages
// that fit; nothing reaches the guest.
func TestTooLargeWriteSaysHow(t *testing.T) {
	limit := catalog.DefaultLimits().MaxMessageBytes
	b64 := strings.Repeat("A", limit)
	for tool, says := range map[string]string{
		"vm_file_write":    fmt.Sprintf("ranges of at most %d bytes (their base64 within the limit): the first whole, the others with append or offset", catalog.DefaultLimits().RawBudget()),
		"vm_archive_write": "several tars",
	} {
		f := newSessFixture(t, haveBins(), "")
		r := f.as(t, "alice", tool, `{"vm":"lab/vm1","path":"/tmp/x","content_base64":"`+b64+`"}`)
		if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "exceeds the limit") || !strings.Contains(r.Text(), says) {
			t.Errorf("%s of %d bytes = %.300q; want %s naming the limit and saying %q", tool, limit, r.Text(), TagInvalid, says)
		}
		if len(f.guest.argvs) != 0 {
			t.Errorf("%s over the limit ran %q in the guest; want nothing", tool, f.guest.argvs)
		}
	}
}
