package guestctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/testload"
)

// The sandbox escapes that went through root-side work on a session's
// files or through names a session controls: each runs from inside a
// session and is checked from outside, on both lab VMs (Landlock ABI 2).

// guestFiles is what `stat` and `sha256sum` say of paths in the guest,
// from outside every session.
func guestFiles(t *testing.T, ctx context.Context, h *Helper, vm string, paths ...string) string {
	t.Helper()
	line := "for p in " + strings.Join(paths, " ") + `; do stat -c '%n %u:%g %a %s' "$p"; sha256sum "$p"; done`
	res := sh(t, ctx, h, vm, line)
	if res.ExitCode != 0 {
		t.Fatalf("%q = %q, %q", line, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// waitGuest polls the shell condition cond in the guest (outside the
// sessions) until it holds or 2 minutes pass.
func waitGuest(t *testing.T, ctx context.Context, h *Helper, vm, cond string) bool {
	t.Helper()
	deadline := time.Now().Add(testload.Scale(2 * time.Minute))
	for time.Now().Before(deadline) {
		if sh(t, ctx, h, vm, cond).ExitCode == 0 {
			return true
		}
	}
	return false
}

// deepA is a/a/.../a, levels deep.
func deepA(levels int) string {
	return strings.TrimSuffix(strings.Repeat("a/", levels), "/")
}

// TestLabRestoreRace is issue 29's first finding: session A builds a tree
// 1,400 levels deep plus d/{shadow,passwd} and e/secret and is destroyed
// with its files kept; session B runs (setsid) a program that polls
// lstat("a") and, once its owner is B's uid, swaps d and e for symlinks to
// /etc and /root; then B gets A's files back. /etc/passwd, /etc/shadow and
// /root/secret must keep their owner, mode and contents, seen from
// outside; the racer must have swapped (else the test proves nothing);
// the restored files must be B's.
func TestLabRestoreRace(t *testing.T) {
	const depth = 1400
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 10*time.Minute)
			pushEscape(t, ctx, h, vm)
			sh(t, ctx, h, vm, "echo root-secret > /root/secret; chmod 600 /root/secret; "+
				"grep -q '^root:' /etc/shadow 2>/dev/null || echo 'root:shadow-secret:19000:0:99999:7:::' > /etc/shadow; chmod 640 /etc/shadow")
			t.Cleanup(func() { sh(t, context.Background(), h, vm, "rm -f /root/secret") })
			watched := []string{"/etc", "/etc/passwd", "/etc/shadow", "/root", "/root/secret"}
			before := guestFiles(t, ctx, h, vm, watched...)

			sb := wire.Sandbox{BestEffort: bestEffort(vm)}
			a := sandboxSession(t, ctx, h, vm, sb)
			build := fmt.Sprintf("mkdir -p %s && mkdir d e && echo s > d/shadow && echo p > d/passwd && echo r > e/secret", deepA(depth))
			if res, err := h.Run(ctx, vm, RunRequest{Session: a.ID, Shell: build, TimeoutMS: 120000}); err != nil || res.ExitCode != 0 {
				t.Fatalf("building the tree in A = %+v, %v", res, err)
			}
			if _, err := h.SessionTrash(ctx, vm, a.ID, time.Hour); err != nil {
				t.Fatalf("SessionTrash(A) = %v", err)
			}
			b := sandboxSession(t, ctx, h, vm, sb)
			racer := "setsid " + escapeBin + " race"
			bgPID(t, ctx, h, vm, b.ID, racer)
			if got := waitMatching(t, &escapeLab{h: h, vm: vm, ctx: ctx}, escapeBin+" race", 1); len(got) != 1 {
				t.Fatalf("the racer is not running: %+v", got)
			}
			r, err := h.SessionRestore(ctx, vm, b.ID, a.ID)
			if err != nil || len(r.Entries) != 3 {
				t.Fatalf("SessionRestore(B from A) = %+v, %v; want a, d, e", r, err)
			}
			if !waitGuest(t, ctx, h, vm, "test -L "+b.Workdir+"/d -a -L "+b.Workdir+"/e -a -e "+b.Workdir+"/raced") {
				t.Fatalf("the racer did not swap d and e (the race was not run): %s", sh(t, ctx, h, vm, "ls -la "+b.Workdir).Stdout)
			}
			if after := guestFiles(t, ctx, h, vm, watched...); after != before {
				t.Errorf("restore changed what it must not:\nbefore\n%s\nafter\n%s", before, after)
			}
			uid := strconv.Itoa(b.Enforced.UID)
			for _, p := range []string{"d.old/shadow", "e.old/secret", deepA(depth)} {
				if got := strings.TrimSpace(string(sh(t, ctx, h, vm, "stat -c %u "+b.Workdir+"/"+p).Stdout)); got != uid {
					t.Errorf("restored %s is owned by %q; want B's uid %s", p[:min(len(p), 20)], got, uid)
				}
			}
			for _, line := range []string{"chmod 0666 /etc/shadow", "truncate -s 1 /etc/passwd", "chmod 0666 d/shadow", "cat e/secret"} {
				if res, err := h.Run(ctx, vm, RunRequest{Session: b.ID, Shell: line}); err != nil || res.ExitCode == 0 {
					t.Errorf("%q in B = %+v, %v; want refused", line, res, err)
				}
			}
			if after := guestFiles(t, ctx, h, vm, watched...); after != before {
				t.Errorf("B changed what it must not:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
}

// TestLabSwappedRulePath is issue 29's second finding: with write paths
// /data/d and /data/d/y and read path /data/d/x (/data/d world-writable),
// a session replaces x and y by symlinks to /; its next command is
// refused, naming the path, and nothing is read or written through them.
func TestLabSwappedRulePath(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 5*time.Minute)
			sh(t, ctx, h, vm, "rm -rf /data/d /sess-made-this /dev/shm/sess-made-this; mkdir -p /data/d/x /data/d/y /home/alice && chmod 0777 /data/d /data/d/x /data/d/y && "+
				"echo alice-notes > /home/alice/notes && chmod 0644 /home/alice/notes")
			t.Cleanup(func() {
				sh(t, context.Background(), h, vm, "rm -rf /data/d /home/alice /sess-made-this /dev/shm/sess-made-this")
			})
			s := sandboxSession(t, ctx, h, vm, wire.Sandbox{FS: wire.FSAccess{Write: []string{"/data/d", "/data/d/y"}, Read: []string{"/data/d/x"}}, BestEffort: bestEffort(vm)})
			attack := "cat /data/d/x/home/alice/notes; echo x > /data/d/y/sess-made-this; echo x > /data/d/y/dev/shm/sess-made-this"
			if res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: attack}); err != nil || strings.Contains(string(res.Stdout), "alice-notes") {
				t.Fatalf("the attack before the swap = %+v, %v; want it denied (else this test proves nothing)", res, err)
			}
			swap := "cd /data/d && mv x x.old && ln -s / x && mv y y.old && ln -s / y"
			if res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: swap}); err != nil || res.ExitCode != 0 {
				t.Fatalf("swapping x and y in the session = %+v, %v", res, err)
			}
			res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: attack})
			var ge *Error
			if !errors.As(err, &ge) || ge.Code != wire.CodeRefused || !strings.Contains(ge.Message, "/data/d/x is a symlink") {
				t.Errorf("the run after the swap = %+v, %v; want refused naming /data/d/x", res, err)
			}
			if strings.Contains(string(res.Stdout), "alice-notes") {
				t.Errorf("the session read /home/alice/notes through the swapped x")
			}
			if out := sh(t, ctx, h, vm, "ls /sess-made-this /dev/shm/sess-made-this 2>/dev/null").Stdout; len(out) != 0 {
				t.Errorf("the session wrote through the swapped y: %s", out)
			}
		})
	}
}

// TestLabReadOnlyOutside is issue 29's third finding: on the lab's
// Landlock ABI 2 (no truncate right; no ABI has chmod, chown or xattrs) a
// session truncated world-writable files outside its directories and set
// an xattr on one. Now every attempt to change a file outside its write
// paths fails, checked from outside, and the report says what holds each
// right.
func TestLabReadOnlyOutside(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 5*time.Minute)
			pushEscape(t, ctx, h, vm)
			s := sandboxSession(t, ctx, h, vm, wire.Sandbox{BestEffort: bestEffort(vm)})
			e := s.Enforced
			truncate := wire.HeldMount // Landlock handles truncate from ABI 3
			if e.Landlock.ABI >= 3 {
				truncate = wire.HeldBoth
			}
			t.Logf("%s: Landlock ABI %d, held by %v", vm, e.Landlock.ABI, e.HeldBy)
			for right, want := range map[string]string{"truncate": truncate, "xattr": wire.HeldMount, "chmod": wire.HeldMount,
				"write": wire.HeldBoth, "read": wire.HeldLandlock} {
				if e.HeldBy[right] != want || !e.ReadOnlyOutside {
					t.Errorf("Enforced.HeldBy[%s] = %q (read-only %v, ABI %d); want %q", right, e.HeldBy[right], e.ReadOnlyOutside, e.Landlock.ABI, want)
				}
			}
			uid, gid := strconv.Itoa(e.UID), strconv.Itoa(e.GID)
			sh(t, ctx, h, vm, "rm -f /data/ww /data/ww-link /data/owned /data/owned2 /var/lib/ww; printf 12345 > /data/ww; printf 12345 > /var/lib/ww; chmod 0666 /data/ww /var/lib/ww; "+
				"echo mine > /data/owned; chown "+uid+":"+gid+" /data/owned; chmod 0644 /data/owned")
			t.Cleanup(func() {
				sh(t, context.Background(), h, vm, "rm -f /data/ww /data/ww-link /data/owned /data/owned2 /var/lib/ww")
			})
			watched := []string{"/data/ww", "/var/lib/ww", "/data/owned"}
			before := guestFiles(t, ctx, h, vm, watched...) + string(sh(t, ctx, h, vm, "stat -c '%Y' /data/owned; "+escapeBin+" listxattr /data/ww").Stdout)
			for _, op := range []string{"truncate /data/ww 1", "truncate /var/lib/ww 1", "setxattr /data/ww user.x v",
				"chmod /data/owned 0666", "chown /data/owned " + uid + " " + gid, "utime /data/owned",
				"link /data/ww /data/ww-link", "rename /data/owned /data/owned2"} {
				res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Argv: append([]string{escapeBin, "fs"}, strings.Fields(op)...)})
				if err != nil || res.ExitCode == 0 {
					t.Errorf("%q in the session = %q, %v; want refused", op, res.Stdout, err)
				}
			}
			after := guestFiles(t, ctx, h, vm, watched...) + string(sh(t, ctx, h, vm, "stat -c '%Y' /data/owned; "+escapeBin+" listxattr /data/ww").Stdout)
			if after != before {
				t.Errorf("files outside the session changed:\nbefore\n%s\nafter\n%s", before, after)
			}
			if out := sh(t, ctx, h, vm, "ls /data/ww-link /data/owned2 2>/dev/null").Stdout; len(out) != 0 {
				t.Errorf("a link or rename outside the session happened: %s", out)
			}
			if res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: "printf 12345 > f && " + escapeBin + " fs truncate f 1 >/dev/null && wc -c < f"}); err != nil || strings.TrimSpace(string(res.Stdout)) != "1" {
				t.Errorf("truncate in the workdir = %+v, %v; want it to work", res, err)
			}
		})
	}
}

// TestLabWriteBlocked (issue 32): a write path the session's uid cannot
// write for its mode (root's, 0755) is named at create with the reason,
// and in the result of a command it refused.
func TestLabWriteBlocked(t *testing.T) {
	for _, vm := range labVMs {
		t.Run(vm, func(t *testing.T) {
			h, _ := labHelper(t, vm)
			ctx := testCtx(t, 5*time.Minute)
			sh(t, ctx, h, vm, "rm -rf /data/rootonly; mkdir /data/rootonly && chmod 0755 /data/rootonly")
			t.Cleanup(func() { sh(t, context.Background(), h, vm, "rm -rf /data/rootonly") })
			s := sandboxSession(t, ctx, h, vm, wire.Sandbox{FS: wire.FSAccess{Write: []string{"/data/rootonly"}}, BestEffort: bestEffort(vm)})
			want := wire.BlockedPath{Path: "/data/rootonly", Reason: "owned by root, mode 0755: the session's uid cannot write"}
			if wb := s.Enforced.WriteBlocked; len(wb) != 1 || wb[0] != want {
				t.Errorf("Enforced.WriteBlocked = %+v; want [%+v]", wb, want)
			}
			res, err := h.Run(ctx, vm, RunRequest{Session: s.ID, Shell: "echo x > /data/rootonly/f"})
			if err != nil || res.ExitCode == 0 || len(res.WriteBlocked) != 1 || res.WriteBlocked[0] != want {
				t.Errorf("a refused write = %+v, %v; want it to name %+v", res, err, want)
			}
		})
	}
}
