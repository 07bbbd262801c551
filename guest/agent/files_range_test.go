//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// patterned is n bytes that differ at every offset modulo 251.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestFileReadRange(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	data := patterned(1_000_003)
	p := filepath.Join(ft.ok, "data")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	size := int64(len(data))
	tests := []struct {
		name           string
		o              ReadOptions
		from, to       int64 // the bytes expected
		eof            bool
		code, wantText string
	}{
		{"whole", ReadOptions{Length: size}, 0, size, true, "", ""},
		{"whole, length past the end", ReadOptions{Length: wire.MaxReadLength}, 0, size, true, "", ""},
		{"head", ReadOptions{Length: 10}, 0, 10, false, "", ""},
		{"middle", ReadOptions{Offset: 300_000, Length: 400_000}, 300_000, 700_000, false, "", ""},
		{"tail", ReadOptions{Offset: size - 3, Length: 10}, size - 3, size, true, "", ""},
		{"ends exactly at the end", ReadOptions{Offset: size - 3, Length: 3}, size - 3, size, true, "", ""},
		{"offset at the end", ReadOptions{Offset: size, Length: 10}, size, size, true, "", ""},
		{"offset past the end", ReadOptions{Offset: size + 1000, Length: 10}, size, size, true, "", ""},
		{"length 0", ReadOptions{Offset: 5, Length: 0}, 5, 5, false, "", ""},
		{"hash with a range", ReadOptions{Offset: 999_000, Length: 100, Hash: true}, 999_000, 999_100, false, "", ""},
		{"hash past the end", ReadOptions{Offset: size + 1, Length: 100, Hash: true}, size, size, true, "", ""},
		{"hash only", ReadOptions{Length: 0, Hash: true}, 0, 0, false, "", ""},
		{"negative offset", ReadOptions{Offset: -1, Length: 10}, 0, 0, false, wire.CodeInvalid, "offset -1"},
		{"negative length", ReadOptions{Length: -1}, 0, 0, false, wire.CodeInvalid, "length -1"},
		{"huge length", ReadOptions{Length: wire.MaxReadLength + 1}, 0, 0, false, wire.CodeInvalid, "length"},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		got, err := a.FileReadRange(context.Background(), p, tc.o, &buf)
		if tc.code != "" {
			if msg := refusal(err, tc.code, "", tc.wantText); msg != "" || buf.Len() != 0 {
				t.Errorf("%s: FileReadRange(%+v) = %v, %d bytes; %s, no data", tc.name, tc.o, err, buf.Len(), msg)
			}
			continue
		}
		want := data[tc.from:tc.to]
		if err != nil || !bytes.Equal(buf.Bytes(), want) || got.Bytes != int64(len(want)) || got.EOF != tc.eof || got.Truncated == tc.eof || got.Size != size || got.Offset != tc.o.Offset {
			t.Errorf("%s: FileReadRange(%+v) = %d bytes (bytes %d), eof %v, truncated %v, size %d, offset %d, %v; want bytes %d..%d, eof %v, size %d",
				tc.name, tc.o, buf.Len(), got.Bytes, got.EOF, got.Truncated, got.Size, got.Offset, err, tc.from, tc.to, tc.eof, size)
		}
		wantSum := ""
		if tc.o.Hash {
			wantSum = sha(data)
		}
		if got.SHA256 != wantSum {
			t.Errorf("%s: sha256 %q; want %q", tc.name, got.SHA256, wantSum)
		}
	}
	// The refusals of a plain read hold for a ranged one.
	for _, bad := range []string{filepath.Join(ft.ok, "link"), filepath.Join(ft.ok, "dirlink", "secret"), filepath.Join(ft.ok, "fifo")} {
		var buf bytes.Buffer
		if _, err := a.FileReadRange(context.Background(), bad, ReadOptions{Length: 10, Hash: true}, &buf); err == nil || buf.Len() != 0 {
			t.Errorf("FileReadRange(%s) = nil error or %d bytes; want a refusal and nothing", bad, buf.Len())
		}
	}
}

// mainReply runs a command line through Main.
type mainReply struct {
	code   int
	reply  wire.Reply
	result json.RawMessage
	tail   []byte // what followed the reply's line
}

func runMain(t *testing.T, a *Agent, stdin []byte, args ...string) mainReply {
	t.Helper()
	var out bytes.Buffer
	code := a.Main(context.Background(), args, bytes.NewReader(stdin), &out)
	line, tail, _ := bytes.Cut(out.Bytes(), []byte("\n"))
	var r struct {
		wire.Reply
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("Main(%q): reply %q: %v", args, line, err)
	}
	return mainReply{code: code, reply: r.Reply, result: r.Result, tail: tail}
}

// stagedData reads and checks the staging files a reply lists.
func stagedData(t *testing.T, a *Agent, d *wire.DataOut) []byte {
	t.Helper()
	var all []byte
	for _, p := range d.Staged {
		if !a.isStagePath(p.Path) || p.Bytes > wire.PieceBytes {
			t.Errorf("staged piece %+v: want a staging file of at most %d bytes", p, wire.PieceBytes)
		}
		b, err := os.ReadFile(p.Path)
		if err != nil || int64(len(b)) != p.Bytes {
			t.Fatalf("staged piece %s: %d bytes, %v; want %d", p.Path, len(b), err, p.Bytes)
		}
		all = append(all, b...)
	}
	return all
}

// TestFileReadOut: the data of a ranged read follows the reply inline, or
// goes to staging pieces (of wire.PieceCap: 4 MiB first) the reply lists;
// auto switches at wire.InlineMax; file unstage removes the pieces.
func TestFileReadOut(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	data := patterned(wire.PieceBytes + 5000)
	p := filepath.Join(ft.ok, "big")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		out            string
		offset, length int
		pieces         int // 0: inline
	}{
		{"inline", 10, 100, 0},
		{"auto", 10, wire.InlineMax, 0},
		{"auto", 10, wire.InlineMax + 1, 1},
		{"stage", 0, 100, 1},
		{"stage", 0, len(data), 5}, // four of 4 MiB and the rest
	}
	for _, tc := range tests {
		r := runMain(t, a, nil, "--out", tc.out, "file", "read", "--path", p, "--offset", strconv.Itoa(tc.offset), "--length", strconv.Itoa(tc.length))
		want := data[tc.offset:min(tc.offset+tc.length, len(data))]
		if r.code != 0 || r.reply.Data == nil || r.reply.Data.Bytes != int64(len(want)) || len(r.reply.Data.Staged) != tc.pieces {
			t.Fatalf("--out %s, %d bytes: exit %d, data %+v; want %d bytes in %d pieces", tc.out, tc.length, r.code, r.reply.Data, len(want), tc.pieces)
		}
		got := r.tail
		if tc.pieces > 0 {
			if len(r.tail) != 0 {
				t.Errorf("--out %s: %d bytes after the reply; want none", tc.out, len(r.tail))
			}
			got = stagedData(t, a, r.reply.Data)
			var paths []string
			for _, s := range r.reply.Data.Staged {
				paths = append(paths, "--path", s.Path)
			}
			if u := runMain(t, a, nil, append([]string{"file", "unstage"}, paths...)...); u.code != 0 {
				t.Errorf("file unstage: exit %d, %s", u.code, u.result)
			}
			for _, s := range r.reply.Data.Staged {
				if _, err := os.Lstat(s.Path); !os.IsNotExist(err) {
					t.Errorf("staged %s after unstage: %v; want it gone", s.Path, err)
				}
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("--out %s, offset %d, length %d: %d bytes back; want the %d of the file", tc.out, tc.offset, tc.length, len(got), len(want))
		}
	}
	// A refused read stages nothing.
	before, _ := os.ReadDir(a.xferDir())
	if r := runMain(t, a, nil, "--out", "stage", "file", "read", "--path", filepath.Join(ft.ok, "link"), "--length", "10"); r.code != 1 || r.reply.Data != nil {
		t.Errorf("staged read of a symlink: exit %d, data %+v; want a refusal without data", r.code, r.reply.Data)
	}
	if after, _ := os.ReadDir(a.xferDir()); len(after) != len(before) {
		t.Errorf("staging directory holds %d files after a refused read; want %d", len(after), len(before))
	}
	// Unstage takes staging files only.
	for _, bad := range []string{ft.secret, a.xferDir() + "/x-../../secret", filepath.Join(a.xferDir(), "notstaged")} {
		if r := runMain(t, a, nil, "file", "unstage", "--path", bad); r.code != 1 || !strings.Contains(string(r.reply.Error.Message), "not a staging file") {
			t.Errorf("file unstage %s: exit %d, %+v; want refused", bad, r.code, r.reply.Error)
		}
	}
	ft.secretIntact(t)
}

// TestDataIn: --in pieces are the command's data, in order; each must be a
// staging file of the size said, and is gone afterwards.
func TestDataIn(t *testing.T) {
	ft := newFileTree(t)
	a := newFileAgent(t)
	st, err := a.FileStageN(context.Background(), 3)
	if err != nil || len(st) != 3 {
		t.Fatalf("FileStageN(3) = %v, %v", st, err)
	}
	parts := [][]byte{patterned(70000), []byte("middle"), patterned(333)}
	var spec []string
	var all []byte
	for i, p := range parts {
		if err := os.WriteFile(st[i].Path, p, 0o600); err != nil {
			t.Fatal(err)
		}
		spec = append(spec, st[i].Path+":"+strconv.Itoa(len(p)))
		all = append(all, p...)
	}
	dest := filepath.Join(ft.ok, "joined")
	r := runMain(t, a, nil, "--in", strings.Join(spec, ","), "file", "write", "--path", dest, "--size", strconv.Itoa(len(all)))
	if r.code != 0 {
		t.Fatalf("file write --in: exit %d, %+v", r.code, r.reply.Error)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, all) {
		t.Errorf("written %d bytes; want the %d of the pieces in order", len(got), len(all))
	}
	for _, s := range st {
		if _, err := os.Lstat(s.Path); !os.IsNotExist(err) {
			t.Errorf("piece %s after the write: %v; want it gone", s.Path, err)
		}
	}
	// Wrong size, not a staging file, malformed.
	st2, _ := a.FileStageN(context.Background(), 1)
	os.WriteFile(st2[0].Path, []byte("12345"), 0o600)
	for _, in := range []string{st2[0].Path + ":4", ft.secret + ":10", st2[0].Path, st2[0].Path + ":-1", st2[0].Path + ":" + strconv.Itoa(wire.PieceBytes+1)} {
		r := runMain(t, a, nil, "--in", in, "file", "write", "--path", filepath.Join(ft.ok, "bad"), "--size", "5")
		if r.code != 1 || r.reply.Error.Code != wire.CodeInvalid {
			t.Errorf("--in %s: exit %d, %+v; want invalid", in, r.code, r.reply.Error)
		}
	}
	if _, err := os.Lstat(filepath.Join(ft.ok, "bad")); !os.IsNotExist(err) {
		t.Errorf("a refused --in wrote the destination (%v)", err)
	}
	ft.secretIntact(t)
}
