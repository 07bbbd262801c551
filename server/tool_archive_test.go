package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/mcptest"
)

// tarOf is a tar of the entries (a name ending in "/" a directory, else a
// file whose content is its name), gzip'd when zip.
func tarOf(t *testing.T, zip bool, names ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if zip {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(n))}
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, n)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

// tarNames are the names in a tar (gzip'd or not); every file holds its
// name, or the test fails.
func tarNames(t *testing.T, data []byte) []string {
	t.Helper()
	names, err := namesOf(data)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func namesOf(data []byte) ([]string, error) {
	var r io.Reader = bytes.NewReader(data)
	if len(data) > 1 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	tr := tar.NewReader(r)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if body, _ := io.ReadAll(tr); h.Typeflag == tar.TypeReg && string(body) != h.Name {
			return nil, fmt.Errorf("tar entry %s holds %q; want its name", h.Name, body)
		}
		out = append(out, h.Name)
	}
}

// guestArchive answers vmgate-guest's dir and archive commands: the
// directory /srv/out holds the entries of tree; an archive write reports
// every entry written but those --skip names (the guest's own refusals
// are guest/agent's tests').
func guestArchive(tree []byte) func([]string, []byte) hypervisor.ExecResult {
	return func(argv []string, stdin []byte) hypervisor.ExecResult {
		p := flag(argv, "--path")
		switch strings.Join(argv[1:3], " ") {
		case "dir list":
			return reply(wire.DirList{Path: p, Depth: 2, Entries: []wire.DirEntry{
				{Path: "a.txt", Type: "file", Size: 5, Mode: 0o644}, {Path: "secret.key", Type: "file", Size: 10, Mode: 0o600},
				{Path: "sub", Type: "dir", Mode: 0o755}, {Path: "sub/link", Type: "symlink", Mode: 0o777, Target: "/etc/shadow"},
			}})
		case "archive read":
			return replyData(wire.ArchiveRead{Path: p, Entries: len(must(namesOf(tree))), Bytes: 42, Gzip: slices.Contains(argv, "--gzip")}, tree)
		case "archive write":
			aw := wire.ArchiveWritten{Path: p}
			skip := flag(argv, "--skip")
			for i, n := range must(namesOf(stdin)) {
				en := wire.ArchiveEntry{Index: i, Name: n, Action: wire.ActionCreate}
				if slices.Contains(strings.Split(skip, ","), strings.TrimSpace(itoa(i))) {
					en.Action, en.Reason, en.Message = wire.ActionRefused, wire.ReasonPolicy, "refused by the policy"
					aw.Refused++
				} else {
					aw.Written++
				}
				aw.Entries = append(aw.Entries, en)
			}
			return reply(aw)
		}
		return replyErr(wire.CodeInvalid, "", "unknown command")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func must(names []string, _ error) []string { return names }

// TestArchiveToolsAskThePolicyPerEntry: the path rules decide on every
// entry of an archive, not only on the directory: a write's refused
// entries reach the guest as --skip (or refuse the call before the guest
// is touched, with denied_entries "refuse"); a read's are cut out of the
// tar before the agent gets it; a listing leaves them out.
func TestArchiveToolsAskThePolicyPerEntry(t *testing.T) {
	const pol = `{"version":"1","default":"deny","tools":{%s}}`
	rules := func(extra string) string {
		r := `{"require":[{"path":"args.path","op":"regex","value":"^/srv/out(/|$)"}],"deny_if":[{"path":"args.path","op":"contains","value":"secret"}]` + extra + `}`
		return strings.Replace(pol, "%s", `"vm_dir_list":`+r+`,"vm_archive_read":`+r+`,"vm_archive_write":`+r, 1)
	}
	names := []string{"a.txt", "secret.key", "sub/", "sub/secret/x", "sub/b"}
	for _, zip := range []bool{false, true} {
		tree := tarOf(t, zip, names...)
		b64 := base64.StdEncoding.EncodeToString(tree)

		f := newSessFixture(t, haveBins(), rules(""))
		f.guest.file = guestArchive(tree)
		r := f.as(t, "alice", "vm_archive_write", `{"vm":"lab/vm1","path":"/srv/out","content_base64":"`+b64+`"}`)
		sc := r.Result.StructuredContent
		if r.Result.IsError || sc["written"] != float64(3) || sc["policy_refused"] != float64(2) {
			t.Errorf("vm_archive_write (gzip %v) = %q %v; want 3 written, 2 refused by the policy", zip, r.Text(), sc)
		}
		if got := lastArgv(f, "archive"); flag(got, "--skip") != "1,3" {
			t.Errorf("archive write ran %q; want --skip 1,3 (secret.key, sub/secret/x)", got)
		}

		r = f.as(t, "alice", "vm_archive_read", `{"vm":"lab/vm1","path":"/srv/out"}`)
		sc = r.Result.StructuredContent
		got, _ := base64.StdEncoding.DecodeString(sc["content_base64"].(string))
		if want := []string{"a.txt", "sub/", "sub/b"}; !slices.Equal(tarNames(t, got), want) {
			t.Errorf("vm_archive_read (gzip %v) tar = %q; want %q (the secret entries cut out)", zip, tarNames(t, got), want)
		}
		if ps, _ := sc["policy_skipped"].([]any); len(ps) != 2 || sc["entries"] != float64(3) {
			t.Errorf("vm_archive_read policy_skipped = %v, entries %v; want the 2 secret paths, 3 entries", sc["policy_skipped"], sc["entries"])
		}
		if zip && (got[0] != 0x1f || got[1] != 0x8b) {
			t.Errorf("vm_archive_read of a gzip'd tar came back not gzip'd")
		}

		f = newSessFixture(t, haveBins(), rules(`,"files":{"denied_entries":"refuse"}`))
		f.guest.file = guestArchive(tree)
		r = f.as(t, "alice", "vm_archive_write", `{"vm":"lab/vm1","path":"/srv/out","content_base64":"`+b64+`"}`)
		if !mcptest.HasTag(r, TagDenied) || !strings.Contains(r.Text(), "/srv/out/secret.key") {
			t.Errorf("vm_archive_write with denied_entries refuse = %q; want %s naming /srv/out/secret.key", r.Text(), TagDenied)
		}
		if got := lastArgv(f, "archive"); got != nil {
			t.Errorf("a refused archive write reached the guest: %q", got)
		}
		if r := f.as(t, "alice", "vm_archive_read", `{"vm":"lab/vm1","path":"/srv/out"}`); !mcptest.HasTag(r, TagDenied) || r.Result.StructuredContent["content_base64"] != nil {
			t.Errorf("vm_archive_read with denied_entries refuse = %q; want %s and no tar", r.Text(), TagDenied)
		}
	}

	f := newSessFixture(t, haveBins(), rules(""))
	f.guest.file = guestArchive(nil)
	r := f.as(t, "alice", "vm_dir_list", `{"vm":"lab/vm1","path":"/srv/out","depth":2}`)
	sc := r.Result.StructuredContent
	if es, _ := sc["entries"].([]any); len(es) != 3 || sc["hidden"] != float64(1) || strings.Contains(r.Text(), "secret") || !strings.Contains(r.Text(), "sub/link -> /etc/shadow") {
		t.Errorf("vm_dir_list = %q %v; want 3 entries (the symlink as data), secret.key hidden", r.Text(), sc)
	}
	if r := f.as(t, "alice", "vm_dir_list", `{"vm":"lab/vm1","path":"/etc"}`); !mcptest.HasTag(r, TagDenied) {
		t.Errorf("vm_dir_list /etc = %q; want %s (the directory itself)", r.Text(), TagDenied)
	}
}

// TestArchiveWriteRefusesBadContentBeforeThePolicy: content that is not
// base64 or not a tar is refused in the validate step: no guest command.
func TestArchiveWriteRefusesBadContentBeforeThePolicy(t *testing.T) {
	for _, tc := range []struct{ content, want string }{
		{"!!", "not valid base64"},
		{base64.StdEncoding.EncodeToString([]byte("not a tar at all, just some bytes that are long enough to be a header? no")), "content_base64"},
		{base64.StdEncoding.EncodeToString([]byte{0x1f, 0x8b, 0, 1}), "gzip"},
	} {
		f := newSessFixture(t, haveBins(), "")
		f.guest.file = guestArchive(nil)
		r := f.as(t, "alice", "vm_archive_write", `{"vm":"lab/vm1","path":"/srv/out","content_base64":"`+tc.content+`"}`)
		if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), tc.want) {
			t.Errorf("vm_archive_write(%q) = %q; want %s containing %q", tc.content, r.Text(), TagInvalid, tc.want)
		}
		if n := len(f.guest.argvs); n != 0 {
			t.Errorf("vm_archive_write(%q) ran %d guest commands; want none", tc.content, n)
		}
	}
}

// lastArgv is the last vmgate-guest command of kind ("archive", "file")
// the fake guest ran, less the binary; nil for none.
func lastArgv(f *sessFixture, kind string) []string {
	var last []string
	for _, a := range f.guest.argvs {
		if len(a) > 2 && a[1] == kind {
			last = a[1:]
		}
	}
	return last
}
