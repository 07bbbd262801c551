//go:build linux

package guestctl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/plugins/libvirt"
)

// The file, dir and archive commands through every backend: the lab VM
// (QEMU), a libvirt domain, and the Proxmox and VirtualBox emulators with
// the lab VM behind them. The same suite runs on each.

// libvirtVM is the libvirt domain TestMain registers.
const libvirtVM = "vmgate-files"

// bigFile is the size of the ranged-read file: four 16 MiB ranges.
const bigFile = 64 << 20

// randomData is n bytes of seeded pseudo-random data (incompressible).
func randomData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func sumHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// guestSum is the sha256sum of path in the guest.
func guestSum(t *testing.T, ctx context.Context, h *Helper, vm, path string) string {
	t.Helper()
	res := shWithin(t, ctx, h, vm, "sha256sum "+path, 10*time.Minute)
	f := strings.Fields(string(res.Stdout))
	if res.ExitCode != 0 || len(f) == 0 {
		t.Fatalf("sha256sum %s: exit %d, %q %q", path, res.ExitCode, res.Stdout, res.Stderr)
	}
	return f[0]
}

// bigPath is the 64 MiB file of the ranged reads, outside the suite's
// directory: making it (/dev/urandom) and hashing it take a TCG guest most
// of a minute, and the QEMU, Proxmox and VirtualBox suites all reach the
// same guest (the lab VM cg), so it is made and hashed once for them.
const bigPath = "/tmp/vmgate-fs-big"

// bigSums maps a guest file's identity (bigID) to its sha256.
var bigSums sync.Map

// bigID identifies bigPath in vm's guest: its boot and the file's inode,
// change time and size (empty when the file is missing).
func bigID(t *testing.T, ctx context.Context, h *Helper, vm string) string {
	t.Helper()
	out := strings.TrimSpace(string(sh(t, ctx, h, vm, "cat /proc/sys/kernel/random/boot_id; stat -c '%i %Z %s' "+bigPath+" 2>/dev/null || true").Stdout))
	if !strings.HasSuffix(out, " "+strconv.Itoa(bigFile)) {
		return ""
	}
	return out
}

// bigFileIn makes bigPath in vm's guest unless it is there already, and
// returns its path and sha256 (sha256sum's, taken once per file).
func bigFileIn(t *testing.T, ctx context.Context, h *Helper, vm string) (path, sum string) {
	t.Helper()
	id := bigID(t, ctx, h, vm)
	if id != "" {
		if v, ok := bigSums.Load(id); ok {
			return bigPath, v.(string)
		}
	} else {
		mk := "head -c " + strconv.Itoa(bigFile) + " /dev/urandom > " + bigPath + ".tmp && mv " + bigPath + ".tmp " + bigPath
		if res := shWithin(t, ctx, h, vm, mk, 10*time.Minute); res.ExitCode != 0 || res.TimedOut {
			t.Fatalf("making %s: exit %d (timed out: %v): %s", bigPath, res.ExitCode, res.TimedOut, res.Stderr)
		}
		if id = bigID(t, ctx, h, vm); id == "" {
			t.Fatalf("%s: not %d bytes after making it", bigPath, bigFile)
		}
	}
	sum = guestSum(t, ctx, h, vm, bigPath)
	bigSums.Store(id, sum)
	return bigPath, sum
}

// dropBigFile removes bigPath from vm's guest (64 MiB of its memory).
func dropBigFile(t *testing.T, ctx context.Context, h *Helper, vm string) {
	sh(t, ctx, h, vm, "rm -f "+bigPath)
}

// fileSuite runs ranged reads, an atomic write, a hostile archive and the
// caps through h on vm. keepBig leaves the 64 MiB file of the ranged reads
// in the guest for the next suite on the same guest.
func fileSuite(t *testing.T, h *Helper, vm string, keepBig bool) {
	ctx := testCtx(t, 20*time.Minute)
	const d = "/tmp/vmgate-fs"
	setup := "rm -rf " + d + "; mkdir -p " + d + "/target " + d + "/outside && printf 'top secret' > " + d + "/outside/secret && " +
		"printf 'old content' > " + d + "/atomic && chmod 0640 " + d + "/atomic && chown 1234:5678 " + d + "/atomic"
	if res := shWithin(t, ctx, h, vm, setup, 10*time.Minute); res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("setup: exit %d (timed out: %v): %s", res.ExitCode, res.TimedOut, res.Stderr)
	}
	t.Cleanup(func() { sh(t, testCtx(t, time.Minute), h, vm, "rm -rf "+d) })
	big, want := bigFileIn(t, ctx, h, vm)
	if !keepBig {
		t.Cleanup(func() { dropBigFile(t, testCtx(t, time.Minute), h, vm) })
	}

	t.Run("ranged read", func(t *testing.T) {
		var all []byte
		var reported string
		start := time.Now()
		for off, n := int64(0), 0; ; n++ {
			r, err := h.FileReadRange(ctx, vm, big, ReadOptions{Offset: off, Length: 16 << 20, Hash: off == 0})
			if err != nil {
				t.Fatalf("FileReadRange(%d) = %v", off, err)
			}
			if off == 0 {
				reported = r.SHA256
			}
			if r.Size != bigFile || r.Offset != off || (n < 3) != r.Truncated {
				t.Errorf("range %d: size %d, offset %d, truncated %v; want %d, %d, %v", n, r.Size, r.Offset, r.Truncated, bigFile, off, n < 3)
			}
			all = append(all, r.Data...)
			off += r.Bytes
			if r.EOF {
				break
			}
		}
		took := time.Since(start)
		if got := sumHex(all); got != want || reported != want || len(all) != bigFile {
			t.Errorf("64 MiB in ranges: %d bytes, sha256 %s, the guest's hash %s; want %s (sha256sum)", len(all), got, reported, want)
		}
		t.Logf("%s: 64 MiB read in 16 MiB ranges in %v (%.1f MiB/s)", vm, took.Round(time.Millisecond), 64/took.Seconds())
	})

	t.Run("atomic write", func(t *testing.T) {
		data := randomData(20<<20, 33)
		start := time.Now()
		w, err := h.FileWrite(ctx, vm, d+"/atomic", data, WriteOptions{CreateMode: 0o644, Hash: true})
		if err != nil || !w.Atomic || w.Created || w.Mode != 0o640 || w.SHA256 != sumHex(data) {
			t.Fatalf("FileWrite(20 MiB) = %+v, %v; want atomic, replacing, mode 0640 kept, its hash", w, err)
		}
		t.Logf("%s: 20 MiB written atomically in %v", vm, time.Since(start).Round(time.Millisecond))
		got := string(sh(t, ctx, h, vm, "stat -c '%a %u %g' "+d+"/atomic; ls -A "+d+" | grep -c vmgate-tmp; ls -A /var/lib/vmgate/xfer | wc -l").Stdout)
		if want := "640 1234 5678\n0\n0\n"; got != want {
			t.Errorf("guest after the write: %q; want %q (owner and mode kept, no temporary or staging file)", got, want)
		}
		if s := guestSum(t, ctx, h, vm, d+"/atomic"); s != sumHex(data) {
			t.Errorf("guest sha256 %s; want %s", s, sumHex(data))
		}
		off := int64(5)
		if _, err := h.FileWrite(ctx, vm, d+"/atomic", []byte("XY"), WriteOptions{Offset: &off, ExpectSHA256: sumHex(data)}); err != nil {
			t.Errorf("FileWrite at offset 5 = %v", err)
		}
		if _, err := h.FileWrite(ctx, vm, d+"/atomic", []byte("!"), WriteOptions{Append: true, ExpectSHA256: sumHex(data)}); !errors.Is(err, ErrRefused) {
			t.Errorf("append with a stale expect_sha256 = %v; want refused", err)
		}
		copy(data[5:], "XY")
		if s := guestSum(t, ctx, h, vm, d+"/atomic"); s != sumHex(data) {
			t.Errorf("after the offset write the guest has %s; want %s", s, sumHex(data))
		}
	})

	t.Run("hostile archive", func(t *testing.T) {
		outsideBefore := string(sh(t, ctx, h, vm, "cd "+d+" && ls -lAR outside && sha256sum outside/secret && ls -A").Stdout)
		data := hostileTar(t, d+"/outside")
		entries, err := ArchiveList(data, d+"/target", ArchiveLimits{})
		if err != nil {
			t.Fatal(err)
		}
		var skip []int
		for _, e := range entries {
			if e.Path == d+"/target/keep/b" {
				skip = append(skip, e.Index) // the policy's say
			}
		}
		w, err := h.ArchiveWrite(ctx, vm, d+"/target", data, ArchiveWriteOptions{Skip: skip})
		if err != nil {
			t.Fatal(err)
		}
		var refused []string
		for _, e := range w.Entries {
			if e.Action == wire.ActionRefused {
				refused = append(refused, e.Name+": "+e.Reason)
			}
		}
		want := []string{"../escape: " + wire.ReasonOutside, d + "/outside/abs: " + wire.ReasonOutside, "out: " + wire.ReasonLinkOut,
			"out/through: " + wire.ReasonConflict, "shadow: " + wire.ReasonLinkOut, "suid: " + wire.ReasonSpecialBits,
			"null: " + wire.ReasonSpecial, "keep/b: " + wire.ReasonPolicy}
		if strings.Join(refused, "; ") != strings.Join(want, "; ") || w.Written != 1 {
			t.Errorf("refused %q, written %d; want %q, 1", refused, w.Written, want)
		}
		if after := string(sh(t, ctx, h, vm, "cd "+d+" && ls -lAR outside && sha256sum outside/secret && ls -A").Stdout); after != outsideBefore {
			t.Errorf("outside the target before:\n%s\nafter:\n%s", outsideBefore, after)
		}
		l, err := h.DirList(ctx, vm, d+"/target", DirOptions{Depth: 3})
		if err != nil || len(l.Entries) != 2 || l.Entries[1].Path != "keep/a" {
			t.Errorf("target after the archive = %+v, %v; want keep and keep/a only", l.Entries, err)
		}
		// And out again.
		ar, tarData, err := h.ArchiveRead(ctx, vm, d+"/target", ArchiveReadOptions{Gzip: true})
		if err != nil || ar.Entries != 2 || ar.Bytes != 5 {
			t.Fatalf("ArchiveRead = %+v, %v", ar, err)
		}
		if back, err := ArchiveList(tarData, "/x", ArchiveLimits{}); err != nil || len(back) != 2 || back[1].Name != "keep/a" {
			t.Errorf("the archive read back lists %+v, %v", back, err)
		}
	})

	t.Run("caps", func(t *testing.T) {
		before := string(sh(t, ctx, h, vm, "ls -lAR "+d+"/target").Stdout)
		var he *Error
		if _, err := h.ArchiveWrite(ctx, vm, d+"/target", hostileTar(t, d+"/outside"), ArchiveWriteOptions{Limits: ArchiveLimits{MaxEntries: 3}}); !errors.As(err, &he) || he.Reason != wire.ReasonLimit {
			t.Errorf("ArchiveWrite over max_entries = %v; want refused over the limits", err)
		}
		if _, _, err := h.ArchiveRead(ctx, vm, d, ArchiveReadOptions{Limits: ArchiveLimits{MaxBytes: 1 << 20}}); !errors.As(err, &he) || he.Reason != wire.ReasonLimit {
			t.Errorf("ArchiveRead over max_bytes = %v; want refused over the limits", err)
		}
		if after := string(sh(t, ctx, h, vm, "ls -lAR "+d+"/target").Stdout); after != before {
			t.Errorf("an over-limit archive changed the target:\n%s\nthen\n%s", before, after)
		}
		if l, err := h.DirList(ctx, vm, d, DirOptions{Depth: 5, MaxEntries: 3}); err != nil || len(l.Entries) != 3 || !l.Truncated {
			t.Errorf("DirList(max 3) = %d entries, truncated %v, %v; want 3, truncated", len(l.Entries), l.Truncated, err)
		}
	})
}

func TestLabFilesQEMU(t *testing.T) {
	h, _ := labHelper(t, "cg")
	fileSuite(t, h, "cg", true) // Proxmox and VirtualBox read it again
}

func TestLabFilesLibvirt(t *testing.T) {
	env := libvirttest.Env(t)
	d, err := libvirt.New(libvirt.Config{URI: env.URI(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	fileSuite(t, New(d, &DirBinaries{Dirs: []string{guestDir}}), libvirtVM, false)
}

func TestLabFilesProxmox(t *testing.T) {
	d, vm := pveDriver(t)
	fileSuite(t, New(d, &DirBinaries{Dirs: []string{guestDir}}), vm, true) // VirtualBox reads it again
}

func TestLabFilesVirtualBox(t *testing.T) {
	d, vm := vboxDriver(t)
	fileSuite(t, New(d, &DirBinaries{Dirs: []string{guestDir}}), vm, false) // the last suite on cg
}
