package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// filesPolicy limits both file tools to /tmp/vmgate-files/ by a prefix
// rule, the kind of rule a symlink used to walk past (issue 15, finding 3).
// Symlinks are not followed (no files block: the defaults).
const filesPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_file_read": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-files/" } ] },
    "vm_file_write": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-files/" } ] },
    "vm_archive_write": { "require": [ { "path": "args.path", "op": "regex", "value": "^/tmp/vmgate-files/" } ] }
  }
}
`

// filesCheck is a guest file a file case checks afterwards.
type filesCheck struct {
	Path    string  `json:"path"`
	Mode    string  `json:"mode"` // as stat -c %a prints it, or "absent"
	Content *string `json:"content"`
}

// filesFixture is what the file cases run against: links out of the allowed
// directory to a root-only file, /etc/passwd, /etc, .. and /proc/self, a
// setuid file, a FIFO and a directory. It prints the hashes of the targets.
const filesFixture = `set -e
D=/tmp/vmgate-files
rm -rf $D /tmp/vmgate-files-pwned /root/vmgate-files-secret
mkdir -p $D/dir
umask 022
printf 'root only' > /root/vmgate-files-secret && chmod 0600 /root/vmgate-files-secret
printf plain > $D/plain
ln -s /root/vmgate-files-secret $D/link
ln -s /etc/passwd $D/passwd
ln -s /etc $D/etc
ln -s .. $D/up
ln -s /proc/self $D/proc
printf x > $D/suid && chmod 4755 $D/suid
mkfifo $D/fifo
sha256sum /etc/passwd /root/vmgate-files-secret`

// TestHostileFiles sends the corpus's file cases over HTTP and stdio to a
// server whose file tools are limited to /tmp/vmgate-files/, then checks
// the guest: the link targets untouched, every file a case names as it
// says (absent, or with its mode and content).
func TestHostileFiles(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	cases := corpusCases(t, "file", 25, func(c hostileCase) bool { return c.Files != nil })
	v1 := labtest.VM(t, vm1)
	before := guestRun(t, v1, "/bin/sh", "-c", filesFixture)
	defer guestRun(t, v1, "/bin/sh", "-c", "rm -rf /tmp/vmgate-files /tmp/vmgate-files-pwned /root/vmgate-files-secret")
	token := newToken()
	s := writeConfig(t, configOpts{
		grants: []grantSpec{{name: "agent", token: token, policy: filesPolicy}, {name: "local", policy: filesPolicy}},
		vms:    []*lab.VM{v1},
	})
	passed, total := 0, 0
	check := func(t *testing.T, transport string, c hostileCase, r reply, err error, body []byte) {
		total++
		if err == nil {
			err = c.check(r, body)
		}
		if err != nil {
			t.Errorf("%s (%s) over %s: %v", c.file, c.Name, transport, err)
			return
		}
		passed++
	}
	t.Run("http", func(t *testing.T) {
		p := startServe(t, s.cfg)
		cl := newHTTPClient(p.url, token)
		ctx := context.Background()
		if err := cl.initialize(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			if c.Transport != "stdio" {
				r, err := cl.post(ctx, c.body(), nil)
				check(t, "HTTP", c, r, err, c.body())
			}
		}
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})
	t.Run("stdio", func(t *testing.T) {
		sc := openStdio(t, s.cfg, "local")
		for i, c := range cases {
			if c.Transport != "http" {
				r, err := stdioExchange(sc, c.body(), i, true)
				check(t, "stdio", c, r, err, c.body())
			}
		}
		if err := sc.close(30 * time.Second); err != nil {
			t.Errorf("stdio server: %v", err)
		}
	})
	if after := guestRun(t, v1, "/bin/sh", "-c", "sha256sum /etc/passwd /root/vmgate-files-secret"); after != before {
		t.Errorf("link targets after the file cases:\n%s\nwant unchanged:\n%s", after, before)
	}
	checked := 0
	for _, c := range cases {
		if c.Files.Path == "" {
			continue
		}
		checked++
		if msg := guestFile(t, v1, *c.Files); msg != "" {
			t.Errorf("%s (%s): %s", c.file, c.Name, msg)
		}
	}
	report.add("hostile file paths", fmt.Sprintf("%d file cases over HTTP and stdio (symlinks, /proc/self, .., setuid, default mode)", len(cases)),
		fmt.Sprintf("%d of %d exchanges as expected; link targets untouched; %d guest files as the cases say", passed, total, checked))
}

// guestFile compares a guest file with fc; "" when it matches.
func guestFile(t *testing.T, vm *lab.VM, fc filesCheck) string {
	t.Helper()
	if fc.Mode == "absent" {
		if got := guestRun(t, vm, "/bin/sh", "-c", "test -e '"+fc.Path+"' || test -L '"+fc.Path+"' && echo exists; true"); got != "" {
			return fc.Path + " exists; want it absent"
		}
		return ""
	}
	got := guestRun(t, vm, "/bin/sh", "-c", "stat -c %a '"+fc.Path+"' && cat '"+fc.Path+"'")
	mode, content, _ := strings.Cut(got, "\n")
	if mode != fc.Mode || (fc.Content != nil && content != *fc.Content) {
		return fmt.Sprintf("%s: mode %s, content %q; want mode %s, content %v", fc.Path, mode, content, fc.Mode, show(fc.Content))
	}
	return ""
}

func show(s *string) string {
	if s == nil {
		return "(any)"
	}
	return fmt.Sprintf("%q", *s)
}

// corpusCases returns the corpus cases keep selects, failing t when there
// are fewer than atLeast (a corpus that lost its cases would pass empty).
func corpusCases(t *testing.T, what string, atLeast int, keep func(hostileCase) bool) []hostileCase {
	t.Helper()
	var cases []hostileCase
	for _, c := range loadCorpus(t) {
		if keep(c) {
			cases = append(cases, c)
		}
	}
	if len(cases) < atLeast {
		t.Fatalf("the corpus has %d %s cases; want at least %d", len(cases), what, atLeast)
	}
	return cases
}
