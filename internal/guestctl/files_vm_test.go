package guestctl

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// TestLabFiles runs file stat, read and write through the real helper in a
// lab guest, against symlinks to a root-only file and /etc/passwd, and then
// checks the guest: the targets untouched, the modes as asked.
func TestLabFiles(t *testing.T) {
	const vm = "cg"
	h, _ := labHelper(t, vm)
	ctx := testCtx(t, 5*time.Minute)
	const d = "/tmp/vmgate-files"
	setup := "rm -rf " + d + " /root/vmgate-secret; mkdir -p " + d + "/sub && umask 0 && " +
		"printf 'top secret' > /root/vmgate-secret && chmod 0600 /root/vmgate-secret && " +
		"ln -s /root/vmgate-secret " + d + "/link && ln -s /etc " + d + "/etc && ln -s /etc/passwd " + d + "/passwd && " +
		"ln -s .. " + d + "/sub/up && printf plain > " + d + "/plain && " +
		"printf x > " + d + "/suid && chmod 4755 " + d + "/suid && sha256sum /etc/passwd /root/vmgate-secret"
	res := sh(t, ctx, h, vm, setup)
	if res.ExitCode != 0 {
		t.Fatalf("setup: exit %d: %s", res.ExitCode, res.Stderr)
	}
	before := string(res.Stdout)
	t.Cleanup(func() { sh(t, testCtx(t, time.Minute), h, vm, "rm -rf "+d+" /root/vmgate-secret") })

	refusals := []struct {
		name   string
		run    func() error
		reason string
		says   string
	}{
		{"read a symlink", func() error { _, err := h.FileRead(ctx, vm, d+"/link", 100); return err }, wire.ReasonSymlink, d + "/link is a symlink"},
		{"read through a directory symlink", func() error { _, err := h.FileRead(ctx, vm, d+"/etc/shadow", 100); return err }, wire.ReasonSymlink, d + "/etc is a symlink"},
		{"read via /proc/self/root", func() error { _, err := h.FileRead(ctx, vm, "/proc/self/root/root/vmgate-secret", 100); return err }, wire.ReasonSymlink, "/proc/self is a symlink"},
		{"write over a symlink to /etc/passwd", func() error {
			_, err := h.FileWrite(ctx, vm, d+"/passwd", []byte("root::0:0::/root:/bin/sh\n"), WriteOptions{CreateMode: 0o644})
			return err
		}, wire.ReasonSymlink, "last component"},
		{"write through a middle symlink", func() error {
			_, err := h.FileWrite(ctx, vm, d+"/sub/up/passwd", []byte("x"), WriteOptions{CreateMode: 0o644})
			return err
		}, wire.ReasonSymlink, d + "/sub/up is a symlink"},
		{"write into an existing setuid file", func() error {
			_, err := h.FileWrite(ctx, vm, d+"/suid", []byte("#!/bin/sh\nid\n"), WriteOptions{CreateMode: 0o644})
			return err
		}, wire.ReasonSpecialBits, "setuid or setgid"},
		{"stat for a write follows no last symlink", func() error { _, err := h.FileStat(ctx, vm, d+"/passwd", true, true); return err }, wire.ReasonSymlink, "last component"},
	}
	for _, tc := range refusals {
		err := tc.run()
		var he *Error
		if !errors.As(err, &he) || he.Code != wire.CodeRefused || he.Reason != tc.reason || !strings.Contains(he.Message, tc.says) {
			t.Errorf("%s = %v; want a %q refusal saying %q", tc.name, err, tc.reason, tc.says)
		}
	}

	// What goes through.
	if fi, err := h.FileStat(ctx, vm, d+"/link", true, false); err != nil || fi.Path != "/root/vmgate-secret" {
		t.Errorf("FileStat(link, follow) = %+v, %v; want the real path /root/vmgate-secret", fi, err)
	}
	if fr, err := h.FileRead(ctx, vm, d+"/plain", 3); err != nil || string(fr.Data) != "pla" || !fr.Truncated {
		t.Errorf("FileRead(plain, 3) = %+v, %v; want pla, truncated", fr, err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB: over StdinMax (the resident helper's channel carries it as stdin), several copy chunks each way
	start := time.Now()
	if fw, err := h.FileWrite(ctx, vm, d+"/big", big, WriteOptions{CreateMode: 0o644}); err != nil || fw.Bytes != int64(len(big)) || !fw.Created {
		t.Fatalf("FileWrite(big) = %+v, %v; want %d bytes, created", fw, err, len(big))
	}
	helperWrite := time.Since(start)
	start = time.Now()
	if fr, err := h.FileRead(ctx, vm, d+"/big", int64(len(big))); err != nil || !bytes.Equal(fr.Data, big) {
		t.Errorf("FileRead(big) = %d bytes, %v; want the 4 MiB back", len(fr.Data), err)
	}
	helperRead := time.Since(start)
	// The same through the agent's own file channel, for the ratio (logged:
	// a time on a shared TCG guest is no limit to assert).
	start = time.Now()
	if err := h.d.FileWrite(ctx, vm, d+"/raw", big, 0o644); err != nil {
		t.Fatalf("driver FileWrite(raw) = %v", err)
	}
	rawWrite := time.Since(start)
	start = time.Now()
	if fc, err := h.d.FileRead(ctx, vm, d+"/raw", int64(len(big))); err != nil || len(fc.Data) != len(big) {
		t.Fatalf("driver FileRead(raw) = %d bytes, %v", len(fc.Data), err)
	}
	rawRead := time.Since(start)
	t.Logf("4 MiB through vmgate-guest / the agent's file channel: write %v / %v = %.2f, read %v / %v = %.2f",
		helperWrite, rawWrite, helperWrite.Seconds()/rawWrite.Seconds(), helperRead, rawRead, helperRead.Seconds()/rawRead.Seconds())
	if fr, err := h.FileRead(ctx, vm, d+"/big", 100); err != nil || !fr.Truncated || len(fr.Data) != 100 {
		t.Errorf("FileRead(big, 100) = %d bytes, truncated %v, %v; want 100, truncated", len(fr.Data), fr.Truncated, err)
	}
	m600 := uint32(0o600)
	writes := []struct {
		file string
		o    WriteOptions
	}{
		{"default", WriteOptions{CreateMode: 0o644}}, // mode left out: 0644, not 0666 under umask 0
		{"explicit", WriteOptions{Mode: &m600, CreateMode: 0o644}},
		{"plain", WriteOptions{CreateMode: 0o644}}, // existing: keeps 0666 (umask 0 at setup)
	}
	for _, w := range writes {
		if _, err := h.FileWrite(ctx, vm, d+"/"+w.file, []byte("new"), w.o); err != nil {
			t.Errorf("FileWrite(%s) = %v; want nil", w.file, err)
		}
	}

	// The guest afterwards.
	got := string(sh(t, ctx, h, vm, "umask 0; sha256sum /etc/passwd /root/vmgate-secret; cd "+d+" && stat -c '%n %a' default explicit plain suid && cat plain").Stdout)
	want := before + "default 644\nexplicit 600\nplain 666\nsuid 4755\nnew"
	if got != want {
		t.Errorf("guest after = %q; want %q (targets untouched, modes as asked)", got, want)
	}
}
