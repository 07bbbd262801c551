//go:build linux

package guestctl

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/guest/agent"
	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// loopGuest is a driver whose guest is this machine: vmgate-guest runs as
// guest/agent's Main in this process (its Root a temporary directory),
// uname and sha256sum answer as a guest with the helper in place, and the
// file channel is the local filesystem. It records what crossed each
// channel and caps exec output as a driver does.
type loopGuest struct {
	a    *agent.Agent
	root string

	mu        sync.Mutex
	execs     [][]string
	stdins    []int
	outs      []int // exec stdout lengths
	results   []hypervisor.ExecResult
	fileReads []string
	fileWrite func(path string, data []byte) error // nil: write it
}

func newLoopGuest(t *testing.T) *loopGuest {
	t.Helper()
	root := t.TempDir()
	a, err := agent.New(agent.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	return &loopGuest{a: a, root: root}
}

func (g *loopGuest) exec(req hypervisor.ExecRequest) hypervisor.ExecResult {
	switch req.Argv[0] {
	case "uname":
		return hypervisor.ExecResult{Exited: true, Stdout: []byte("x86_64\n")}
	case "sha256sum":
		sum, _ := fixedBinaries{}.Binary("amd64")
		return hypervisor.ExecResult{Exited: true, Stdout: []byte(sum.SHA256 + "  " + req.Argv[1] + "\n")}
	case GuestPath:
		var out bytes.Buffer
		code := g.a.Main(context.Background(), req.Argv[1:], bytes.NewReader(req.Stdin), &out)
		res := hypervisor.ExecResult{Exited: true, ExitCode: code, Stdout: out.Bytes()}
		if req.MaxOutputBytes > 0 && int64(len(res.Stdout)) > req.MaxOutputBytes {
			res.Stdout, res.StdoutTruncated = res.Stdout[:req.MaxOutputBytes], true
		}
		return res
	}
	return hypervisor.ExecResult{Exited: true, ExitCode: 127}
}

func (g *loopGuest) driver() *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			res := g.exec(req)
			g.mu.Lock()
			defer g.mu.Unlock()
			g.execs = append(g.execs, req.Argv)
			g.stdins = append(g.stdins, len(req.Stdin))
			g.outs = append(g.outs, len(res.Stdout))
			g.results = append(g.results, res)
			return hypervisor.ExecHandle{PID: int64(len(g.results))}, nil
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.results[h.PID-1], nil
		},
		FileReadFunc: func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
			g.mu.Lock()
			g.fileReads = append(g.fileReads, path)
			g.mu.Unlock()
			b, err := os.ReadFile(path)
			if err != nil {
				return hypervisor.FileContent{}, err
			}
			if int64(len(b)) > maxBytes {
				return hypervisor.FileContent{Data: b[:maxBytes], Truncated: true}, nil
			}
			return hypervisor.FileContent{Data: b}, nil
		},
		FileWriteFunc: func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
			if g.fileWrite != nil {
				if err := g.fileWrite(path, data); err != nil {
					return err
				}
			}
			return os.WriteFile(path, data, 0o600)
		},
	}
}

// staging lists what is left in the guest's staging directory.
func (g *loopGuest) staging(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(g.root, "xfer"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// channelsBounded checks no exec carried more than StdinMax of stdin or
// more than inlineMax of output beyond its reply.
func (g *loopGuest) channelsBounded(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, a := range g.execs {
		if g.stdins[i] > StdinMax || g.outs[i] > inlineMax+1<<20 {
			t.Errorf("exec %q carried %d bytes of stdin and %d of output; want at most %d and %d", a, g.stdins[i], g.outs[i], StdinMax, inlineMax+1<<20)
		}
	}
}

func loopSetup(t *testing.T) (*loopGuest, *Helper, string) {
	t.Helper()
	g := newLoopGuest(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return g, New(g.driver(), fixedBinaries{}), dir
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 253)
	}
	return b
}

// TestLoopRangesReassemble: a file larger than one piece goes in staged
// and atomically, comes back in ranges that reassemble it, and the hash
// the guest reports is the file's; nothing stays staged, and no exec
// carries more than its channel's share.
func TestLoopRangesReassemble(t *testing.T) {
	g, h, dir := loopSetup(t)
	ctx := context.Background()
	data := pattern(20<<20 + 12345)
	p := filepath.Join(dir, "big")
	os.WriteFile(p, []byte("old"), 0o640)
	w, err := h.FileWrite(ctx, "vm", p, data, WriteOptions{CreateMode: 0o644, Hash: true})
	if err != nil || !w.Atomic || w.Created || w.Mode != 0o640 || w.Bytes != int64(len(data)) || w.SHA256 != shaHex(data) {
		t.Fatalf("FileWrite(20 MiB) = %+v, %v; want atomic, replaced, 0640, its hash", w, err)
	}
	var got []byte
	var sum string
	for off := int64(0); ; {
		r, err := h.FileReadRange(ctx, "vm", p, ReadOptions{Offset: off, Length: 16 << 20, Hash: off == 0})
		if err != nil {
			t.Fatalf("FileReadRange(%d) = %v", off, err)
		}
		if off == 0 {
			sum = r.SHA256
		}
		got = append(got, r.Data...)
		off += r.Bytes
		if r.EOF {
			break
		}
	}
	if !bytes.Equal(got, data) || sum != shaHex(data) {
		t.Errorf("ranges reassemble %d bytes (hash %s); want the %d written (hash %s)", len(got), sum, len(data), shaHex(data))
	}
	if r, err := h.FileReadRange(ctx, "vm", p, ReadOptions{Offset: int64(len(data)) + 5, Length: 10}); err != nil || !r.EOF || len(r.Data) != 0 || r.Size != int64(len(data)) {
		t.Errorf("FileReadRange past the end = %+v, %v; want nothing, EOF, the size", r, err)
	}
	if r, err := h.FileReadRange(ctx, "vm", p, ReadOptions{Offset: 7, Length: 100}); err != nil || !bytes.Equal(r.Data, data[7:107]) || r.EOF {
		t.Errorf("FileReadRange(7, 100) = %d bytes, eof %v, %v; want 100 bytes inline", len(r.Data), r.EOF, err)
	}
	if s := g.staging(t); len(s) != 0 {
		t.Errorf("staging files left: %v", s)
	}
	g.channelsBounded(t)
}

func TestLoopWriteMethods(t *testing.T) {
	g, h, dir := loopSetup(t)
	ctx := context.Background()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("0123456789"), 0o600)
	off := int64(4)
	big := pattern(StdinMax + 100) // staged
	steps := []struct {
		o    WriteOptions
		data []byte
		want string
		code string
	}{
		{WriteOptions{Offset: &off}, []byte("ab"), "0123ab6789", ""},
		{WriteOptions{Append: true, ExpectSHA256: shaHex([]byte("0123ab6789"))}, []byte("!"), "0123ab6789!", ""},
		{WriteOptions{Append: true, ExpectSHA256: shaHex([]byte("stale"))}, []byte("?"), "0123ab6789!", "refused"},
		{WriteOptions{Append: true}, big, "0123ab6789!" + string(big), ""},
	}
	for i, s := range steps {
		_, err := h.FileWrite(ctx, "vm", p, s.data, s.o)
		var he *Error
		if s.code == "" && err != nil || s.code != "" && (!errors.As(err, &he) || he.Code != s.code) {
			t.Errorf("step %d: FileWrite = %v; want code %q", i, err, s.code)
		}
		if b, _ := os.ReadFile(p); string(b) != s.want {
			t.Errorf("step %d: file holds %d bytes; want %d", i, len(b), len(s.want))
		}
	}
	neg := int64(-1)
	for _, o := range []WriteOptions{{Offset: &off, Append: true}, {Offset: &neg}, {ExpectSHA256: "abc"}} {
		if _, err := h.FileWrite(ctx, "vm", p, nil, o); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileWrite(%+v) = %v; want invalid before the guest", o, err)
		}
	}
	if s := g.staging(t); len(s) != 0 {
		t.Errorf("staging files left: %v", s)
	}
	g.channelsBounded(t)
}

// TestLoopStagingFails: when the file channel fails half-way through the
// staged data (a guest agent that stops), the old file is intact and the
// pieces already staged are removed.
func TestLoopStagingFails(t *testing.T) {
	g, h, dir := loopSetup(t)
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old"), 0o644)
	n := 0
	g.fileWrite = func(path string, data []byte) error {
		if n++; n == 2 {
			return hypervisor.ErrAgentUnavailable
		}
		return nil
	}
	_, err := h.FileWrite(context.Background(), "vm", p, pattern(40<<20), WriteOptions{CreateMode: 0o644})
	if !errors.Is(err, hypervisor.ErrAgentUnavailable) || !strings.Contains(err.Error(), "piece 2 of 10") {
		t.Errorf("FileWrite with a failing file channel = %v; want the agent's failure, at piece 2 of 10 (4 MiB each)", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("file after the failed write holds %d bytes; want old", len(b))
	}
	if s := g.staging(t); len(s) != 0 {
		t.Errorf("staging files left: %v", s)
	}
}

func shaHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// hostileTar is an archive with ../escape, an absolute name, a symlink
// out and a file through it, a hard link to a file outside, a setuid file
// and a device, then two plain files.
func hostileTar(t *testing.T, outside string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeReg, Name: "../escape", Size: 5, Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: outside + "/abs", Size: 5, Mode: 0o644},
		{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside, Mode: 0o777},
		{Typeflag: tar.TypeReg, Name: "out/through", Size: 5, Mode: 0o644},
		{Typeflag: tar.TypeLink, Name: "shadow", Linkname: outside + "/secret", Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: "suid", Size: 5, Mode: 0o4755},
		{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666},
		{Typeflag: tar.TypeReg, Name: "keep/a", Size: 5, Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: "keep/b", Size: 5, Mode: 0o644},
	} {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write([]byte("pwned"))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestLoopArchive: the host lists the entries' paths for its policy, the
// guest refuses the hostile ones entry by entry (and the ones the policy
// refused), nothing lands outside; a tree larger than one inline reply
// comes back out through staging, and goes back in.
func TestLoopArchive(t *testing.T) {
	g, h, dir := loopSetup(t)
	ctx := context.Background()
	target, outside := filepath.Join(dir, "target"), filepath.Join(dir, "outside")
	os.Mkdir(target, 0o755)
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("top secret"), 0o600)
	data := hostileTar(t, outside)
	listed, err := ArchiveList(data, target, ArchiveLimits{})
	if err != nil || len(listed) != 9 {
		t.Fatalf("ArchiveList = %d entries, %v; want 9", len(listed), err)
	}
	var skip []int
	for _, e := range listed {
		switch {
		case e.Index < 2 && (e.Path != "" || e.Action != "refused"):
			t.Errorf("listed %q: path %q, action %q; want no path, refused", e.Name, e.Path, e.Action)
		case e.Index >= 2 && !strings.HasPrefix(e.Path, target+"/"):
			t.Errorf("listed %q: path %q; want beneath %s", e.Name, e.Path, target)
		}
		if e.Path == filepath.Join(target, "keep/b") { // the policy's say
			skip = append(skip, e.Index)
		}
	}
	got, err := h.ArchiveWrite(ctx, "vm", target, data, ArchiveWriteOptions{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range got.Entries {
		actions = append(actions, e.Action+":"+e.Reason)
	}
	want := "refused:path leaves the target refused:path leaves the target refused:link leaves the target refused:conflicts with what is there " +
		"refused:link leaves the target refused:setuid, setgid or sticky bits refused:device or special file create: refused:refused by the policy"
	if strings.Join(actions, " ") != want || got.Written != 1 {
		t.Errorf("ArchiveWrite = %q, written %d; want %q, 1", strings.Join(actions, " "), got.Written, want)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside holds %d entries; want only the secret", len(ents))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("next to the target: %d entries; want target and outside only", len(ents))
	}
	if b, _ := os.ReadFile(filepath.Join(target, "keep/a")); string(b) != "pwned" {
		t.Errorf("keep/a = %q; want it written", b)
	}
	// A tree of more than inlineMax: out through staging, and back in.
	src := filepath.Join(dir, "src")
	for i := range 40 {
		os.MkdirAll(filepath.Join(src, "d"+string(rune('a'+i%5))), 0o755)
		os.WriteFile(filepath.Join(src, "d"+string(rune('a'+i%5)), "f"+strings.Repeat("x", i)), pattern(64<<10+i), 0o644)
	}
	os.Symlink(outside+"/secret", filepath.Join(src, "to-secret"))
	ar, tarData, err := h.ArchiveRead(ctx, "vm", src, ArchiveReadOptions{})
	if err != nil || ar.Entries != 46 || int64(len(tarData)) < ar.Bytes {
		t.Fatalf("ArchiveRead = %+v, %d bytes, %v; want 46 entries", ar, len(tarData), err)
	}
	if len(g.fileReads) == 0 {
		t.Errorf("a %d-byte archive came back without the file channel; want it staged", len(tarData))
	}
	back := filepath.Join(dir, "back")
	w, err := h.ArchiveWrite(ctx, "vm", back, tarData, ArchiveWriteOptions{Create: true, SymlinksOut: true})
	if err != nil || w.Written != 46 {
		t.Fatalf("ArchiveWrite(back) = written %d, %v; want 46", w.Written, err)
	}
	l, err := h.DirList(ctx, "vm", back, DirOptions{Depth: 2, MaxEntries: 100})
	if err != nil || len(l.Entries) != 46 || l.Entries[45].Path != "to-secret" || l.Entries[45].Target != outside+"/secret" {
		t.Errorf("DirList(back) = %d entries, %v; want 46, the link to the secret kept as a link", len(l.Entries), err)
	}
	if s := g.staging(t); len(s) != 0 {
		t.Errorf("staging files left: %v", s)
	}
	g.channelsBounded(t)
	// Arguments checked on the host.
	n := len(g.execs)
	for _, err := range []error{
		func() error { _, err := h.DirList(ctx, "vm", "rel", DirOptions{}); return err }(),
		func() error { _, err := h.DirList(ctx, "vm", dir, DirOptions{Depth: -1}); return err }(),
		func() error {
			_, _, err := h.ArchiveRead(ctx, "vm", dir, ArchiveReadOptions{Limits: ArchiveLimits{MaxBytes: -1}})
			return err
		}(),
		func() error { _, err := h.ArchiveWrite(ctx, "vm", dir+"/", data, ArchiveWriteOptions{}); return err }(),
		func() error {
			_, err := h.ArchiveWrite(ctx, "vm", dir, data, ArchiveWriteOptions{Skip: []int{wire.DefaultArchiveEntries}})
			return err
		}(),
		func() error { _, err := h.FileReadRange(ctx, "vm", dir, ReadOptions{Offset: -1}); return err }(),
		func() error {
			_, err := h.FileReadRange(ctx, "vm", dir, ReadOptions{Length: wire.MaxReadLength + 1})
			return err
		}(),
	} {
		if !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("bad arguments = %v; want invalid", err)
		}
	}
	if len(g.execs) != n {
		t.Errorf("bad arguments reached the guest: %q", g.execs[n:])
	}
}

func TestIndexRanges(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{{[]int{3}, "3"}, {[]int{5, 1, 2, 3, 9, 9, 10}, "1-3,5,9-10"}, {[]int{0, 2, 4}, "0,2,4"}} {
		if got, err := indexRanges(tc.in, 100); got != tc.want || err != nil {
			t.Errorf("indexRanges(%v) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := indexRanges([]int{-1}, 100); err == nil {
		t.Errorf("indexRanges(-1) = nil error; want out of range")
	}
}
