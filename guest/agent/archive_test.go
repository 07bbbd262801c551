//go:build linux

package agent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// specEntry is one line of a testdata/archives/*.txt archive.
type specEntry struct {
	typ, name string
	mode      int64
	arg       string
	expect    string // create, replace, exists, refused:<reason>
}

// expectReasons are the short reason names the spec files use.
var expectReasons = map[string]string{
	"outside": wire.ReasonOutside, "linkout": wire.ReasonLinkOut, "conflict": wire.ReasonConflict,
	"symlink": wire.ReasonSymlink, "specialbits": wire.ReasonSpecialBits, "special": wire.ReasonSpecial,
	"unsupported": wire.ReasonUnsupported, "policy": wire.ReasonPolicy, "hardlink": wire.ReasonHardlink,
}

// readSpec reads an archive spec, OUTSIDE replaced by outside.
func readSpec(t *testing.T, name, outside string) []specEntry {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "archives", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []specEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fl := strings.Fields(strings.ReplaceAll(line, "OUTSIDE", outside))
		if len(fl) != 5 {
			t.Fatalf("%s: %q: want 5 fields", name, line)
		}
		mode, err := strconv.ParseInt(fl[2], 8, 64)
		if err != nil {
			t.Fatalf("%s: %q: mode: %v", name, line, err)
		}
		out = append(out, specEntry{typ: fl[0], name: fl[1], mode: mode, arg: fl[3], expect: fl[4]})
	}
	return out
}

// buildTar writes the entries as a tar (gzip'd when gz).
func buildTar(t testing.TB, entries []specEntry, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	flags := map[string]byte{"file": tar.TypeReg, "dir": tar.TypeDir, "symlink": tar.TypeSymlink, "hardlink": tar.TypeLink,
		"char": tar.TypeChar, "block": tar.TypeBlock, "fifo": tar.TypeFifo, "other": 'Z'}
	for _, e := range entries {
		h := &tar.Header{Typeflag: flags[e.typ], Name: e.name, Mode: e.mode, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		switch e.typ {
		case "file":
			h.Size = int64(len(e.arg))
		case "symlink", "hardlink":
			h.Linkname = e.arg
		case "char", "block":
			maj, min, _ := strings.Cut(e.arg, ",")
			h.Devmajor, _ = strconv.ParseInt(maj, 10, 64)
			h.Devminor, _ = strconv.ParseInt(min, 10, 64)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %+v: %v", h, err)
		}
		if e.typ == "file" {
			tw.Write([]byte(e.arg))
		}
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

// archiveSite is a target directory with a sibling outside it:
//
//	outside/secret     "top secret"
//	target/existing    "old", 0644
//	target/planted  -> outside (put there before the archive came)
type archiveSite struct{ root, target, outside string }

func newArchiveSite(t *testing.T) archiveSite {
	t.Helper()
	root, _ := filepath.EvalSymlinks(t.TempDir())
	s := archiveSite{root: root, target: filepath.Join(root, "target"), outside: filepath.Join(root, "outside")}
	for _, err := range []error{
		os.Mkdir(s.target, 0o755), os.Mkdir(s.outside, 0o755),
		os.WriteFile(filepath.Join(s.outside, "secret"), []byte("top secret"), 0o600),
		os.WriteFile(filepath.Join(s.target, "existing"), []byte("old"), 0o644),
		os.Symlink(s.outside, filepath.Join(s.target, "planted")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// snapshot describes every file under dir: type, mode, size, content or
// link target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, _ := d.Info()
		desc := fmt.Sprintf("%v", info.Mode())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case info.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	return out
}

func sameSnapshot(a, b map[string]string) string {
	for k, v := range a {
		if b[k] != v {
			return fmt.Sprintf("%s: %q, then %q", k, v, b[k])
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			return fmt.Sprintf("%s: new, %q", k, v)
		}
	}
	return ""
}

// outsideUntouched checks that nothing but the target changed under root.
func (s archiveSite) outsideUntouched(t *testing.T, before map[string]string) {
	t.Helper()
	after := snapshot(t, s.root)
	for k := range after {
		if k == "target" || strings.HasPrefix(k, "target/") {
			delete(after, k)
		}
	}
	if d := sameSnapshot(before, after); d != "" {
		t.Errorf("outside the target: %s", d)
	}
}

func (s archiveSite) outsideSnapshot(t *testing.T) map[string]string {
	m := snapshot(t, s.root)
	for k := range m {
		if k == "target" || strings.HasPrefix(k, "target/") {
			delete(m, k)
		}
	}
	return m
}

func source(data []byte) func() (io.Reader, error) {
	return func() (io.Reader, error) { return bytes.NewReader(data), nil }
}

// checkEntries compares a reply's entries with the spec's expectations.
func checkEntries(t *testing.T, spec []specEntry, got wire.ArchiveWritten, allowed map[string]string) {
	t.Helper()
	if len(got.Entries) != len(spec) {
		t.Fatalf("%d entries in the reply; want %d: %+v", len(got.Entries), len(spec), got.Entries)
	}
	for i, e := range spec {
		want := e.expect
		if a, ok := allowed[e.name]; ok {
			want = a
		}
		g := got.Entries[i]
		action, reason, _ := strings.Cut(want, ":")
		if g.Index != i || g.Action != action || reason != "" && g.Reason != expectReasons[reason] {
			t.Errorf("entry %d %s %q: %s %q (%s); want %s", i, e.typ, e.name, g.Action, g.Reason, g.Message, want)
		}
	}
}

func TestArchiveWriteHostile(t *testing.T) {
	bothWalks(t, func(t *testing.T) {
		for _, gz := range []bool{false, true} {
			s := newArchiveSite(t)
			spec := readSpec(t, "hostile.txt", s.outside)
			before := s.outsideSnapshot(t)
			a := newFileAgent(t)
			got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{}, source(buildTar(t, spec, gz)))
			if err != nil {
				t.Fatalf("ArchiveWrite(hostile, gzip %v) = %v", gz, err)
			}
			checkEntries(t, spec, got, nil)
			s.outsideUntouched(t, before)
			if got.Written != 4 || got.Refused != len(spec)-5 {
				t.Errorf("written %d, refused %d; want 4, %d", got.Written, got.Refused, len(spec)-5)
			}
			want := map[string]string{"existing": "-rw------- replaced", "ok": "drwxr-xr-x", "ok/plain": "-rw-r--r-- fine",
				"ok/inside": "Lrwxrwxrwx -> plain", "ok/again": "-rw-r--r-- fine", "planted": "Lrwxrwxrwx -> " + s.outside, ".": "drwxr-xr-x"}
			if d := sameSnapshot(want, snapshot(t, s.target)); d != "" {
				t.Errorf("target after the hostile archive: %s", d)
			}
		}
	})
}

// TestArchiveWriteHostileAllowed: with the policy's leave, setuid files,
// devices, FIFOs and symlinks out are written; still nothing goes through
// a symlink, and nothing lands outside the target.
func TestArchiveWriteHostileAllowed(t *testing.T) {
	s := newArchiveSite(t)
	spec := readSpec(t, "hostile.txt", s.outside)
	before := s.outsideSnapshot(t)
	a := newFileAgent(t)
	got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{SpecialBits: true, Devices: true, SymlinksOut: true}, source(buildTar(t, spec, false)))
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, spec, got, map[string]string{"out": "create", "up": "create", "suid": "create", "sgid": "create", "sticky": "create",
		"null": "create", "disk": "create", "pipe": "create", "up/escape3": "refused:conflict", "out/through": "refused:conflict"})
	s.outsideUntouched(t, before)
	for name, want := range map[string]os.FileMode{"suid": os.ModeSetuid | 0o755, "sgid": os.ModeSetgid | 0o755, "pipe": os.ModeNamedPipe | 0o644,
		"null": os.ModeDevice | os.ModeCharDevice | 0o666, "sticky": os.ModeDir | os.ModeSticky | 0o777} {
		st, err := os.Lstat(filepath.Join(s.target, name))
		if err != nil || st.Mode() != want {
			t.Errorf("%s: %v, %v; want mode %v", name, st.Mode(), err, want)
		}
	}
	if st, _ := os.Lstat(filepath.Join(s.target, "null")); st.Sys().(*syscall.Stat_t).Rdev != uint64(1<<8|3) {
		t.Errorf("null: rdev %#x; want 1,3", st.Sys().(*syscall.Stat_t).Rdev)
	}
	if l, _ := os.Readlink(filepath.Join(s.target, "out")); l != s.outside {
		t.Errorf("out -> %q; want %q, kept as a link", l, s.outside)
	}
}

// TestArchiveWriteAllOrNothing: one refused entry and nothing is written;
// a dry run says what would happen and writes nothing either.
func TestArchiveWriteAllOrNothing(t *testing.T) {
	s := newArchiveSite(t)
	spec := readSpec(t, "hostile.txt", s.outside)
	data := buildTar(t, spec, true)
	all := snapshot(t, s.root)
	a := newFileAgent(t)
	got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{AllOrNothing: true}, source(data))
	if err != nil || !got.Aborted || got.Written != 0 {
		t.Errorf("ArchiveWrite(all or nothing) = aborted %v, written %d, %v; want aborted, 0", got.Aborted, got.Written, err)
	}
	checkEntries(t, spec, got, nil)
	if d := sameSnapshot(all, snapshot(t, s.root)); d != "" {
		t.Errorf("after an aborted archive: %s", d)
	}
	got, err = a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{DryRun: true}, source(data))
	if err != nil || !got.DryRun || got.Aborted {
		t.Errorf("ArchiveWrite(dry run) = %+v, %v", got, err)
	}
	checkEntries(t, spec, got, nil)
	for _, e := range got.Entries {
		if e.Path != "" && !strings.HasPrefix(e.Path, s.target) {
			t.Errorf("dry run: entry %q has path %q outside the target", e.Name, e.Path)
		}
	}
	if d := sameSnapshot(all, snapshot(t, s.root)); d != "" {
		t.Errorf("after a dry run: %s", d)
	}
	// The host's listing gives the same paths, for the policy.
	listed, err := wire.ListArchive(bytes.NewReader(data), s.target, wire.ArchiveLimits{})
	if err != nil || len(listed) != len(got.Entries) {
		t.Fatalf("ListArchive = %d entries, %v; want %d", len(listed), err, len(got.Entries))
	}
	for i := range listed {
		if listed[i].Path != got.Entries[i].Path || listed[i].Index != i {
			t.Errorf("ListArchive entry %d: path %q; the guest's %q", i, listed[i].Path, got.Entries[i].Path)
		}
	}
}

// TestArchiveWriteBenign extracts a tree into an existing directory and
// into one it creates, and skips what the policy refused.
func TestArchiveWriteBenign(t *testing.T) {
	bothWalks(t, func(t *testing.T) {
		s := newArchiveSite(t)
		spec := readSpec(t, "benign.txt", s.outside)
		a := newFileAgent(t)
		os.Chown(filepath.Join(s.target, "existing"), 1234, 5678)
		got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{Skip: map[int]bool{11: true}}, source(buildTar(t, spec, true)))
		if err != nil {
			t.Fatal(err)
		}
		checkEntries(t, spec, got, map[string]string{"run.sh": "refused:policy"})
		want := map[string]string{".": "drwxr-xr-x", "existing": "-rw-r----- replaced", "planted": "Lrwxrwxrwx -> " + s.outside,
			"src": "drwxr-x---", "src/main.go": "-rw-r--r-- package-main", "src/lib": "drwxr-xr-x", "src/lib/util.go": "-rw------- package-lib",
			"src/current": "Lrwxrwxrwx -> lib/util.go", "link-to-dir": "Lrwxrwxrwx -> src/lib", "src/main-again.go": "-rw-r--r-- package-main",
			"twice": "-rw-r--r-- second", "empty": "drwx------"}
		if d := sameSnapshot(want, snapshot(t, s.target)); d != "" {
			t.Errorf("target: %s", d)
		}
		if st, _ := os.Stat(filepath.Join(s.target, "existing")); st.Sys().(*syscall.Stat_t).Uid != 1234 {
			t.Errorf("replaced file's owner = %d; want 1234 kept", st.Sys().(*syscall.Stat_t).Uid)
		}
		m, _ := os.Stat(filepath.Join(s.target, "src/main.go"))
		h, _ := os.Stat(filepath.Join(s.target, "src/main-again.go"))
		if !os.SameFile(m, h) || m.ModTime().Unix() != 1700000000 {
			t.Errorf("hard link: same file %v, mtime %v; want one file, the archive's mtime", os.SameFile(m, h), m.ModTime())
		}
		if d, _ := os.Stat(filepath.Join(s.target, "src")); d.ModTime().Unix() != 1700000000 {
			t.Errorf("src mtime %v; want the archive's", d.ModTime())
		}
		// A new target directory.
		fresh := filepath.Join(s.root, "fresh")
		if _, err := a.ArchiveWrite(context.Background(), fresh, ArchiveWriteOptions{}, source(buildTar(t, spec, false))); !isCode(err, wire.CodeNotFound) {
			t.Errorf("ArchiveWrite into a missing directory = %v; want not found", err)
		}
		got, err = a.ArchiveWrite(context.Background(), fresh, ArchiveWriteOptions{Create: true}, source(buildTar(t, spec, false)))
		if err != nil || got.Written != len(spec)-1 || got.Refused != 0 {
			t.Errorf("ArchiveWrite(--create) = written %d, refused %d, %v; want %d, 0", got.Written, got.Refused, err, len(spec)-1)
		}
		if l := leftovers(t, s.target); len(l) != 0 {
			t.Errorf("temporary files left: %v", l)
		}
	})
}

// TestArchiveWriteLimits: over-limit and malformed archives write nothing.
func TestArchiveWriteLimits(t *testing.T) {
	s := newArchiveSite(t)
	a := newFileAgent(t)
	all := snapshot(t, s.root)
	many := make([]specEntry, 11)
	for i := range many {
		many[i] = specEntry{typ: "file", name: "f" + strconv.Itoa(i), mode: 0o644, arg: "x"}
	}
	// A real gzip bomb: 64 MiB of zeros in one file, some 64 KiB compressed.
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: 64 << 20})
	io.CopyN(tw, zeros{}, 64<<20)
	tw.Close()
	zw.Close()
	// A bomb of headers: small files with a 900 KiB PAX record each.
	var hb bytes.Buffer
	htw := tar.NewWriter(&hb)
	for i := range 4 {
		htw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "h" + strconv.Itoa(i), Mode: 0o644, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"VMGATE.pad": strings.Repeat("p", 900<<10)}})
	}
	htw.Close()
	huge := buildTar(t, []specEntry{{typ: "file", name: "small", mode: 0o644, arg: strings.Repeat("x", 3000)}}, false)
	// Claim 1 TiB in a header: the archive says so, the content never comes.
	var hg bytes.Buffer
	hw := tar.NewWriter(&hg)
	hw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "small", Mode: 0o644})
	hw.Flush()
	hg.Write(bytes.Repeat([]byte{0}, 1024))
	raw := hg.Bytes()
	hdr := bytes.Replace(raw[:512], []byte("00000000000\x00"), []byte("17777777777\x00"), 1) // octal size field
	copy(raw, hdr)
	fixChecksum(raw[:512])
	tests := []struct {
		name string
		data []byte
		lim  wire.ArchiveLimits
		code string
		want string
	}{
		{"too many entries", buildTar(t, many, true), wire.ArchiveLimits{MaxEntries: 10}, wire.CodeRefused, "more than 10 entries"},
		{"content over max bytes", buildTar(t, many, false), wire.ArchiveLimits{MaxBytes: 10}, wire.CodeRefused, "past max_bytes 10"},
		{"gzip bomb", bomb.Bytes(), wire.ArchiveLimits{MaxBytes: 1 << 20}, wire.CodeRefused, "past max_bytes"},
		{"header bomb", hb.Bytes(), wire.ArchiveLimits{MaxBytes: 1 << 20}, wire.CodeRefused, "bytes of tar stream"},
		{"huge size in a header", raw, wire.ArchiveLimits{}, wire.CodeRefused, "past max_bytes"},
		{"truncated", huge[:len(huge)-3000], wire.ArchiveLimits{}, wire.CodeInvalid, "not a readable tar"},
		{"not a tar", []byte("hello, this is not a tar archive at all, but it is long enough to have a header block's worth of text in it ........................................................................................................................................................................................................................................................................................................................................................................................................................."), wire.ArchiveLimits{}, wire.CodeInvalid, "not a readable tar"},
		{"bad gzip", []byte{0x1f, 0x8b, 1, 2, 3}, wire.ArchiveLimits{}, wire.CodeInvalid, "gzip"},
		{"max bytes out of range", huge, wire.ArchiveLimits{MaxBytes: wire.MaxArchiveBytes + 1}, wire.CodeInvalid, "max_bytes"},
	}
	for _, tc := range tests {
		start := time.Now()
		_, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{Limits: tc.lim}, source(tc.data))
		if msg := refusal(err, tc.code, map[string]string{wire.CodeRefused: wire.ReasonLimit}[tc.code], tc.want); msg != "" {
			t.Errorf("%s: ArchiveWrite = %v; %s", tc.name, err, msg)
		}
		if d := sameSnapshot(all, snapshot(t, s.root)); d != "" {
			t.Errorf("%s: wrote %s", tc.name, d)
		}
		if tc.name == "gzip bomb" {
			t.Logf("gzip bomb (%d bytes) refused in %v", len(tc.data), time.Since(start))
		}
	}
}

// fixChecksum recomputes a tar header block's checksum.
func fixChecksum(h []byte) {
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// TestArchiveRoundTrip: archive read keeps symlinks (also ones pointing
// out) as links without following them, skips FIFOs and lists them; archive
// write of that tar rebuilds the tree.
func TestArchiveRoundTrip(t *testing.T) {
	ft := newFileTree(t)
	src := filepath.Join(ft.root, "tree")
	for _, err := range []error{
		os.MkdirAll(filepath.Join(src, "a/b/c"), 0o755),
		os.WriteFile(filepath.Join(src, "a/b/c/deep"), patterned(100_000), 0o640),
		os.WriteFile(filepath.Join(src, "top"), []byte("top"), 0o600),
		os.Symlink(ft.secret, filepath.Join(src, "to-secret")),
		os.Symlink("..", filepath.Join(src, "a/up")),
		os.Symlink("b/c/deep", filepath.Join(src, "a/deep-link")),
		syscall.Mkfifo(filepath.Join(src, "a/fifo"), 0o644),
		os.Mkdir(filepath.Join(src, "empty"), 0o700),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	a := newFileAgent(t)
	for _, gz := range []bool{false, true} {
		var buf bytes.Buffer
		res, err := a.ArchiveRead(context.Background(), src, gz, wire.ArchiveLimits{}, &buf)
		if err != nil || res.Entries != 9 || res.Bytes != 100_003 || len(res.Skipped) != 1 || res.Skipped[0].Path != "a/fifo" || res.Skipped[0].Type != "fifo" {
			t.Fatalf("ArchiveRead(gzip %v) = %+v, %v; want 9 entries, 100003 bytes, the FIFO skipped", gz, res, err)
		}
		listed, err := wire.ListArchive(bytes.NewReader(buf.Bytes()), "/x", wire.ArchiveLimits{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range listed {
			names = append(names, e.Name+":"+e.Type+":"+e.Link)
			if strings.Contains(e.Name, "secret") && e.Type != "symlink" {
				t.Errorf("the secret was archived as %s", e.Type)
			}
		}
		want := "a/:dir: a/b/:dir: a/b/c/:dir: a/b/c/deep:file: a/deep-link:symlink:b/c/deep a/up:symlink:.. empty/:dir: to-secret:symlink:" + ft.secret + " top:file:"
		if strings.Join(names, " ") != want {
			t.Errorf("archive entries = %q; want %q (sorted, links as links)", strings.Join(names, " "), want)
		}
		dst := filepath.Join(ft.root, "copy"+strconv.FormatBool(gz))
		got, err := a.ArchiveWrite(context.Background(), dst, ArchiveWriteOptions{Create: true, SymlinksOut: true}, source(buf.Bytes()))
		if err != nil || got.Written != 9 {
			t.Fatalf("ArchiveWrite(copy) = %+v, %v", got, err)
		}
		orig, copied := snapshot(t, src), snapshot(t, dst)
		delete(orig, "a/fifo")
		if d := sameSnapshot(orig, copied); d != "" {
			t.Errorf("copied tree differs: %s", d)
		}
	}
	ft.secretIntact(t)
	// Limits.
	var buf bytes.Buffer
	for _, lim := range []wire.ArchiveLimits{{MaxEntries: 3}, {MaxBytes: 99_999}} {
		if _, err := a.ArchiveRead(context.Background(), src, false, lim, &buf); !isCode(err, wire.CodeRefused) || !strings.Contains(err.Error(), "limits") {
			t.Errorf("ArchiveRead(%+v) = %v; want refused over the limits", lim, err)
		}
	}
	for _, p := range []string{filepath.Join(ft.ok, "dirlink"), filepath.Join(ft.ok, "plain")} {
		if _, err := a.ArchiveRead(context.Background(), p, false, wire.ArchiveLimits{}, &buf); !isCode(err, wire.CodeRefused) {
			t.Errorf("ArchiveRead(%s) = %v; want refused (a symlink, not a directory)", p, err)
		}
	}
}

// TestArchiveCommandLine runs archive read and write through Main, the
// tar staged out and back in.
func TestArchiveCommandLine(t *testing.T) {
	s := newArchiveSite(t)
	spec := readSpec(t, "benign.txt", s.outside)
	data := buildTar(t, spec, true)
	a := newFileAgent(t)
	// Stdin, dry run.
	r := runMain(t, a, data, "archive", "write", "--path", s.target, "--dry-run", "--skip", "2,10-11")
	var w wire.ArchiveWritten
	if r.code != 0 || json.Unmarshal(r.result, &w) != nil || !w.DryRun || w.Refused != 4 || w.Entries[2].Reason != wire.ReasonPolicy || w.Entries[6].Reason != wire.ReasonLinkOut || w.Written != 0 {
		t.Fatalf("archive write --dry-run: exit %d, %s", r.code, r.result)
	}
	// Staged in.
	st, _ := a.FileStageN(context.Background(), 1)
	os.WriteFile(st[0].Path, data, 0o600)
	r = runMain(t, a, nil, "--in", st[0].Path+":"+strconv.Itoa(len(data)), "archive", "write", "--path", s.target)
	if r.code != 0 || json.Unmarshal(r.result, &w) != nil || w.Written != len(spec)-1 {
		t.Fatalf("archive write --in: exit %d, %s", r.code, r.result)
	}
	// Staged out, and back.
	r = runMain(t, a, nil, "--out", "stage", "archive", "read", "--path", filepath.Join(s.target, "src"), "--gzip")
	var ar wire.ArchiveRead
	if r.code != 0 || json.Unmarshal(r.result, &ar) != nil || r.reply.Data == nil || len(r.reply.Data.Staged) != 1 || !ar.Gzip || ar.Entries != 5 {
		t.Fatalf("archive read --out stage: exit %d, %s, data %+v", r.code, r.result, r.reply.Data)
	}
	tarData := stagedData(t, a, r.reply.Data)
	listed, err := wire.ListArchive(bytes.NewReader(tarData), "/", wire.ArchiveLimits{})
	if err != nil || len(listed) != 5 {
		t.Errorf("staged archive lists %d entries, %v; want 5", len(listed), err)
	}
	for _, bad := range [][]string{
		{"archive", "write", "--path", s.target, "--skip", "x"},
		{"archive", "write", "--path", s.target, "--max-entries", "0"},
		{"archive", "read", "--path", s.target, "--max-bytes", "-1"},
		{"archive", "list", "--path", s.target},
		{"dir", "list", "--path", s.target, "--depth", "0"},
	} {
		if r := runMain(t, a, nil, bad...); r.code != 1 || r.reply.Error.Code != wire.CodeInvalid {
			t.Errorf("Main(%q) = exit %d, %+v; want invalid", bad, r.code, r.reply.Error)
		}
	}
}
