package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
)

// The file rows: the MCP tools through `vmgate serve` as shipped (stdio,
// the gate, the QEMU driver in its plugin process, vmgate-guest's safe
// roads in the guest) against the guest agent's raw roads, on a lab VM,
// each round one of each right after the other.
//
//	12a  read of a 64 MiB file in ranges: vm_file_read with offset and
//	     length 16 MiB, reading on from where each result ends (one result
//	     carries at most the message limit, 8 MiB: about 6 MiB of binary
//	     data as base64), every range's content_base64 decoded and the whole
//	     hashed / one guest-file-read loop over the file (qga.Client.FileRead,
//	     256 KiB a call)
//	12b  write of the same: vm_file_write, the first range whole (atomic),
//	     the others appended, each range the most one message carries (as
//	     the command's stdin on the resident helper's channel) / one
//	     guest-file-write loop (qga.Client.FileWrite)
//	12c  extraction of a 2,000-file tar: vm_archive_write (every entry asked
//	     of the policy on the host, the tar on the resident helper's
//	     channel, every entry checked beneath the target's descriptor in the
//	     guest, each file through a temporary one, named after its batch's
//	     sync) / tar -x with the tar on guest-exec's stdin
//
// The server runs for the whole row (its first call, in the warm-up,
// launches the plugin and pushes vmgate-guest); the baselines go through
// the second agent of agent2.go, so neither waits for the other's
// connection. The rows are in MiB/s and files/s: higher is better.

const (
	benchFileSize  = 64 << 20
	benchRange     = 16 << 20
	benchTreeFiles = 2000
	benchGuestDir  = "/tmp/vmgate-bench-files"
	// benchWriteRange is the most data one vm_file_write message carries:
	// base64 within the message limit (8 MiB) less room for the envelope.
	benchWriteRange = (8<<20 - 64<<10) / 4 * 3
)

// filesPolicy allows the file tools without a counter.
const filesPolicy = `{"version":"1","default":"deny","tools":{"vm_file_read":{},"vm_file_write":{},"vm_archive_write":{}}}`

func fileRows(ctx context.Context, vmgate string, warmup, pairs int) []*Row {
	read := &Row{ID: "12a", Unit: "MiB/s", What: "read of a 64 MiB file in ranges: vm_file_read (MCP stdio, gate, QEMU plugin, no-follow open, the range inline over the resident helper's channel, base64 in the result; one result at most 8 MiB) / raw guest-file-read loop"}
	write := &Row{ID: "12b", Unit: "MiB/s", What: "write of a 64 MiB file: vm_file_write (atomic first range, then appends; ranges of one message, over the resident helper's channel) / raw guest-file-write loop"}
	arch := &Row{ID: "12c", Unit: "files/s", What: "extraction of a 2,000-file tar: vm_archive_write (policy per entry, tar over the resident helper's channel, checked entry by entry, atomic files synced per batch) / raw tar -x through guest-exec stdin"}
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
	fb, err := newFileBench(ctx, l)
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
	srv  *stdioProc  // vmgate serve
	raw  *qga.Client // the second agent
	data []byte      // what 12b writes
	tree string      // the tar 12c extracts, base64
	raw0 []byte      // the same tar
	sum  [32]byte    // of the file 12a reads
}

func newFileBench(ctx context.Context, l *labEnv) (*fileBench, error) {
	vm1, err := lab.Get(l.stateDir, "vm1")
	if err != nil {
		return nil, err
	}
	sock, err := addAgent(ctx, vm1)
	if err != nil {
		return nil, err
	}
	tree := benchTree()
	fb := &fileBench{raw: qga.New(sock), data: benchData(benchFileSize, 1), raw0: tree, tree: base64.StdEncoding.EncodeToString(tree)}
	file := benchData(benchFileSize, 2)
	fb.sum = sha256.Sum256(file)
	if err := fb.rawExec(ctx, nil, "mkdir", "-p", benchGuestDir); err != nil {
		fb.raw.Close()
		return nil, err
	}
	if err := fb.raw.FileWrite(ctx, benchGuestDir+"/read", file, 0o644); err != nil {
		fb.raw.Close()
		return nil, fmt.Errorf("12a: writing the file to read: %w", err)
	}
	cfg, err := l.writePolicyConfig("files", filesPolicy)
	if err == nil {
		fb.srv, err = l.serve(ctx, cfg)
	}
	if err != nil {
		fb.raw.Close()
		return nil, err
	}
	return fb, nil
}

func (fb *fileBench) close() {
	if err := fb.srv.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: files: %v\n", err)
	}
	fb.raw.Close()
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
	const p = benchGuestDir + "/read"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchFileSize>>20, func() error {
			sum, n, err := fb.toolRead(ctx, p)
			if err == nil && (n != benchFileSize || sum != fb.sum) {
				err = fmt.Errorf("12a: the ranges read (%d bytes) are not the file", n)
			}
			return err
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

// toolRead reads p through vm_file_read in ranges of benchRange, each from
// where the last result ended, and hashes what came.
func (fb *fileBench) toolRead(ctx context.Context, p string) (sum [32]byte, n int64, err error) {
	h := sha256.New()
	for {
		r, err := fb.srv.client.callTool(ctx, "vm_file_read", fmt.Sprintf(`{"vm":"lab/vm1","path":%q,"offset":%d,"length":%d}`, p, n, benchRange))
		if err != nil {
			return sum, n, fmt.Errorf("12a: %w", err)
		}
		var sc struct {
			Bytes  int64  `json:"bytes"`
			EOF    bool   `json:"eof"`
			Base64 string `json:"content_base64"`
		}
		if err := json.Unmarshal(r.StructuredContent, &sc); err != nil {
			return sum, n, fmt.Errorf("12a: vm_file_read result: %w", err)
		}
		data, err := base64.StdEncoding.DecodeString(sc.Base64)
		if err != nil || int64(len(data)) != sc.Bytes {
			return sum, n, fmt.Errorf("12a: vm_file_read gave %d bytes of content_base64 (%v); its bytes say %d", len(data), err, sc.Bytes)
		}
		h.Write(data)
		n += sc.Bytes
		if sc.EOF || sc.Bytes == 0 {
			break
		}
	}
	copy(sum[:], h.Sum(nil))
	return sum, n, nil
}

func (fb *fileBench) writeRound(ctx context.Context, i int) (vmgate, raw float64, err error) {
	const pa, pb = benchGuestDir + "/written-vmgate", benchGuestDir + "/written-raw"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchFileSize>>20, func() error { return fb.toolWrite(ctx, pa) })
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

// toolWrite writes fb.data to p through vm_file_write: the first range
// whole, the others appended.
func (fb *fileBench) toolWrite(ctx context.Context, p string) error {
	for off := 0; off < len(fb.data); off += benchWriteRange {
		b64 := base64.StdEncoding.EncodeToString(fb.data[off:min(off+benchWriteRange, len(fb.data))])
		how := ""
		if off > 0 {
			how = `,"append":true`
		}
		if _, err := fb.srv.client.callTool(ctx, "vm_file_write", fmt.Sprintf(`{"vm":"lab/vm1","path":%q,"content_base64":%q%s}`, p, b64, how)); err != nil {
			return fmt.Errorf("12b: at %d: %w", off, err)
		}
	}
	return nil
}

func (fb *fileBench) archiveRound(ctx context.Context, i int) (vmgate, raw float64, err error) {
	const pa, pb = benchGuestDir + "/tree-vmgate", benchGuestDir + "/tree-raw"
	err = order(i, func() (err error) {
		vmgate, err = rate(benchTreeFiles, func() error {
			r, err := fb.srv.client.callTool(ctx, "vm_archive_write", fmt.Sprintf(`{"vm":"lab/vm1","path":%q,"content_base64":%q,"create":true}`, pa, fb.tree))
			if err != nil {
				return err
			}
			var w struct{ Written, Refused int }
			if err := json.Unmarshal(r.StructuredContent, &w); err != nil || w.Written != benchTreeFiles+50 || w.Refused != 0 {
				return fmt.Errorf("wrote %d entries, refused %d (%v); want %d", w.Written, w.Refused, err, benchTreeFiles+50)
			}
			return nil
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
		raw, err = rate(benchTreeFiles, func() error { return fb.rawExec(ctx, fb.raw0, "tar", "-x", "-C", pb) })
		if err == nil {
			err = fb.rawExec(ctx, nil, "rm", "-rf", pb)
		}
		return err
	})
	return vmgate, raw, err
}
