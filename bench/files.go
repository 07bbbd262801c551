package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// The file rows, at the guestctl level (the tools will call it): what
// vmgate-guest's safe roads cost against the guest agent's raw ones, on a
// lab VM, each round one of each right after the other.
//
//	12a  read of a 64 MiB file in 16 MiB ranges: guestctl.FileReadRange
//	     (vmgate-guest opens it following no symlink and stages each range;
//	     the driver's file channel reads the stage) / one guest-file-read
//	     loop over the file (qga.Client.FileRead, 256 KiB a call)
//	12b  write of the same in 16 MiB ranges: guestctl.FileWrite (the first
//	     range atomically, the others at their offsets; each staged through
//	     the file channel, then copied by vmgate-guest) / one
//	     guest-file-write loop (qga.Client.FileWrite)
//	12c  extraction of a 2,000-file tar: guestctl.ArchiveWrite (two passes,
//	     every entry beneath the target's descriptor, each file through a
//	     temporary one) / tar -x with the tar on guest-exec's stdin
//
// guestctl runs over an in-process QEMU driver on the VM's agent; the
// baselines over the second agent of agent2.go, so neither waits for the
// other's connection. The rows are in MiB/s and files/s: higher is better.

const (
	benchFileSize  = 64 << 20
	benchRange     = 16 << 20
	benchTreeFiles = 2000
	benchGuestDir  = "/tmp/vmgate-bench-files"
)

func fileRows(ctx context.Context, vmgate string, warmup, pairs int) []*Row {
	read := &Row{ID: "12a", Unit: "MiB/s", What: "read of a 64 MiB file in 16 MiB ranges: guestctl FileReadRange (no-follow open, staged, file channel) / raw guest-file-read loop"}
	write := &Row{ID: "12b", Unit: "MiB/s", What: "write of a 64 MiB file in 16 MiB ranges: guestctl FileWrite (atomic first range, then offsets; staged) / raw guest-file-write loop"}
	arch := &Row{ID: "12c", Unit: "files/s", What: "extraction of a 2,000-file tar: guestctl ArchiveWrite (checked entry by entry, atomic files) / raw tar -x through guest-exec stdin"}
	rows := []*Row{read, write, arch}
	fail := func(err error) []*Row { return failRows(rows, pairs, err) }
	if withoutQEMU(rows) {
		return rows
	}
	l, err := startLab(ctx, vmgate, 1, "--memory", "512")
	defer l.stopLogged()
	if err != nil {
		return fail(err)
	}
	fb, err := newFileBench(ctx, l, vmgate)
	if err != nil {
		return fail(err)
	}
	defer fb.close()
	err = Rounds(ctx, warmup, pairs, func(ctx context.Context, i int, counts bool) error {
		ra, rb, err := fb.readRound(ctx, i)
		if err != nil {
			return err
		}
		wa, wb, err := fb.writeRound(ctx, i)
		if err != nil {
			return err
		}
		aa, ab, err := fb.archiveRound(ctx, i)
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		return errors.Join(read.Add(ra, rb), write.Add(wa, wb), arch.Add(aa, ab))
	})
	if err != nil {
		return fail(err)
	}
	return rows
}

// fileBench is the lab VM with both roads to it.
type fileBench struct {
	d    *qemu.Driver
	h    *guestctl.Helper
	raw  *qga.Client // the second agent
	data []byte      // what 12b writes
	tree []byte      // the tar 12c extracts
	sum  [32]byte    // of the file 12a reads
}

func newFileBench(ctx context.Context, l *labEnv, vmgate string) (*fileBench, error) {
	vm1, err := lab.Get(l.stateDir, "vm1")
	if err != nil {
		return nil, err
	}
	sock, err := addAgent(ctx, vm1)
	if err != nil {
		return nil, err
	}
	d, err := qemu.New(qemu.Config{LabDir: filepath.Dir(vm1.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	fb := &fileBench{d: d, raw: qga.New(sock), data: benchData(benchFileSize, 1), tree: benchTree()}
	// vmgate-guest for the guest, built beside vmgate by scripts/bench.sh.
	fb.h = guestctl.New(d, &guestctl.DirBinaries{Dirs: []string{filepath.Dir(vmgate)}})
	file := benchData(benchFileSize, 2)
	fb.sum = sha256.Sum256(file)
	if err := fb.rawExec(ctx, nil, "mkdir", "-p", benchGuestDir); err != nil {
		fb.close()
		return nil, err
	}
	if err := fb.raw.FileWrite(ctx, benchGuestDir+"/read", file, 0o644); err != nil {
		fb.close()
		return nil, fmt.Errorf("12a: writing the file to read: %w", err)
	}
	return fb, nil
}

func (fb *fileBench) close() {
	fb.raw.Close()
	fb.d.Close()
}

// rawExec runs argv through the second agent and wants exit 0.
func (fb *fileBench) rawExec(ctx context.Context, stdin []byte, argv ...string) error {
	st, err := fb.raw.Exec(ctx, qga.ExecRequest{Path: argv[0], Args: argv[1:], Stdin: stdin, Timeout: 5 * time.Minute})
	if err != nil {
		return fmt.Errorf("%s: %w", argv[0], err)
	}
	if st.ExitCode != 0 || st.TimedOut {
		return fmt.Errorf("%s: exit %d: %s", argv[0], st.ExitCode, st.Stderr)
	}
	return nil
}

// benchData is n bytes of seeded pseudo-random data (incompressible, as a
// build output or a dataset is).
func benchData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// benchTree is a tar of benchTreeFiles files of 1–3 KiB in 50 directories.
func benchTree() []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := benchData(4<<10, 3)
	for i := range benchTreeFiles {
		dir := "src/d" + strconv.Itoa(i%50)
		if i < 50 {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: time.Unix(1700000000, 0)})
		}
		n := 1024 + i%2048
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + "/f" + strconv.Itoa(i) + ".go", Mode: 0o644, Size: int64(n), ModTime: time.Unix(1700000000, 0)})
		tw.Write(content[:n])
	}
	tw.Close()
	return buf.Bytes()
}

// rate runs f and returns its rate: amount per second.
func rate(amount float64, f func() error) (float64, error) {
	t0 := time.Now()
	if err := f(); err != nil {
		return 0, err
	}
	return amount / time.Since(t0).Seconds(), nil
}

// order runs a and b, a first on even rounds.
func order(i int, a, b func() error) error {
	if i%2 == 1 {
		a, b = b, a
	}
	if err := a(); err != nil {
		return err
	}
	return b()
}

func (fb *fileBench) readRound(ctx context.Context, i int) (vmgate, raw float64, err error) {
	const vm, p = "vm1", benchGuestDir + "/read"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchFileSize>>20, func() error {
			h := sha256.New()
			for off := int64(0); off < benchFileSize; off += benchRange {
				r, err := fb.h.FileReadRange(ctx, vm, p, guestctl.ReadOptions{Offset: off, Length: benchRange})
				if err != nil {
					return fmt.Errorf("12a: %w", err)
				}
				h.Write(r.Data)
			}
			if !bytes.Equal(h.Sum(nil), fb.sum[:]) {
				return errors.New("12a: the ranges read are not the file")
			}
			return nil
		})
		return err
	}, func() (err error) {
		raw, err = rate(benchFileSize>>20, func() error {
			data, _, err := fb.raw.FileRead(ctx, p, benchFileSize)
			if err == nil && sha256.Sum256(data) != fb.sum {
				err = errors.New("the raw read is not the file")
			}
			return err
		})
		return err
	})
	return vmgate, raw, err
}

func (fb *fileBench) writeRound(ctx context.Context, i int) (vmgate, raw float64, err error) {
	const vm, pa, pb = "vm1", benchGuestDir + "/written-vmgate", benchGuestDir + "/written-raw"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchFileSize>>20, func() error {
			for off := int64(0); off < benchFileSize; off += benchRange {
				o := guestctl.WriteOptions{CreateMode: 0o644}
				if off > 0 {
					o.Offset = &off
				}
				if _, err := fb.h.FileWrite(ctx, vm, pa, fb.data[off:off+benchRange], o); err != nil {
					return fmt.Errorf("12b: %w", err)
				}
			}
			return nil
		})
		if err == nil {
			err = fb.rawExec(ctx, nil, "rm", "-f", pa) // untimed, and room for the other
		}
		return err
	}, func() (err error) {
		raw, err = rate(benchFileSize>>20, func() error { return fb.raw.FileWrite(ctx, pb, fb.data, 0) })
		if err == nil {
			err = fb.rawExec(ctx, nil, "rm", "-f", pb)
		}
		return err
	})
	return vmgate, raw, err
}

func (fb *fileBench) archiveRound(ctx context.Context, i int) (vmgate, raw float64, err error) {
	const vm, pa, pb = "vm1", benchGuestDir + "/tree-vmgate", benchGuestDir + "/tree-raw"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchTreeFiles, func() error {
			w, err := fb.h.ArchiveWrite(ctx, vm, pa, fb.tree, guestctl.ArchiveWriteOptions{Create: true})
			if err == nil && (w.Written != benchTreeFiles+50 || w.Refused != 0) {
				err = fmt.Errorf("wrote %d entries, refused %d; want %d", w.Written, w.Refused, benchTreeFiles+50)
			}
			return err
		})
		if err == nil {
			err = fb.rawExec(ctx, nil, "rm", "-rf", pa)
		}
		if err != nil {
			err = fmt.Errorf("12c: %w", err)
		}
		return err
	}, func() (err error) {
		if err := fb.rawExec(ctx, nil, "mkdir", "-p", pb); err != nil {
			return err
		}
		raw, err = rate(benchTreeFiles, func() error { return fb.rawExec(ctx, fb.tree, "tar", "-x", "-C", pb) })
		if err == nil {
			err = fb.rawExec(ctx, nil, "rm", "-rf", pb)
		}
		return err
	})
	return vmgate, raw, err
}
