//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Staging: data too large for one message of the exec channel (Proxmox
// relays at most 64 KiB of stdin; qemu-ga returns at most 16 MiB of output,
// slowly) moves through the driver's file channel in staging files that
// vmgate-guest creates in <Root>/xfer (0700, this user's, no symlink on the
// way), each at most wire.PieceBytes:
//
//   - in: file stage --count N makes N empty staging files; the host fills
//     them and runs the command with --in P1:N1,P2:N2,...; vmgate-guest
//     opens each (checking it is a staging file of the size said), removes
//     its name at once and reads them one after another as the command's
//     data input.
//   - out: with --out stage (or --out auto, once the output passes the
//     inline limit) the command's data output goes to new staging files
//     listed in the reply (wire.DataOut); the host reads them and removes
//     them with file unstage. With --out inline (or auto under the limit)
//     the data follows the reply's line on stdout.
//
// Only the destination of a command is the agent's path; the staging paths
// are vmgate's own. Staging files older than stageTTL (a host that died
// between two steps) are removed by the next file stage.

// stageTTL: stage removes staging files older than this.
const stageTTL = time.Hour

var stageName = regexp.MustCompile(`^x-[0-9a-f]{32}$`)

func (a *Agent) xferDir() string { return filepath.Join(a.cfg.Root, "xfer") }

// checkXferDir makes sure the staging directory exists, is a real directory
// of this user and no one else's to enter.
func (a *Agent) checkXferDir(op string) error {
	dir := a.xferDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fileErr(op, dir, err)
	}
	fd, err := openNoFollow(op, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileErr(op, dir, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return refused(wire.ReasonNotRegular, "%s: refused: staging directory %s is not private (uid %d, mode %#o)", op, dir, st.Uid, st.Mode&0o7777)
	}
	return nil
}

// FileStage creates an empty private staging file and returns its path.
func (a *Agent) FileStage(ctx context.Context) (wire.FileInfo, error) {
	ps, err := a.FileStageN(ctx, 1)
	if err != nil {
		return wire.FileInfo{}, err
	}
	return ps[0], nil
}

// FileStageN creates n empty private staging files (1..wire.MaxPieces).
func (a *Agent) FileStageN(ctx context.Context, n int) ([]wire.FileInfo, error) {
	const op = "file stage"
	if n < 1 || n > wire.MaxPieces {
		return nil, invalidf("%s: --count %d: want 1..%d", op, n, wire.MaxPieces)
	}
	if err := a.checkXferDir(op); err != nil {
		return nil, err
	}
	a.removeStale()
	out := make([]wire.FileInfo, 0, n)
	for range n {
		f, err := a.newStaged(op)
		if err != nil {
			a.unstage(out)
			return nil, err
		}
		f.Close()
		out = append(out, wire.FileInfo{Path: f.Name(), Exists: true, Type: "file", Mode: 0o600})
	}
	return out, nil
}

func (a *Agent) unstage(fs []wire.FileInfo) {
	for _, f := range fs {
		_ = os.Remove(f.Path)
	}
}

// newStaged creates a new staging file for writing (the directory checked).
func (a *Agent) newStaged(op string) (*os.File, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	p := filepath.Join(a.xferDir(), "x-"+hex.EncodeToString(b))
	fd, err := openNoFollow(op, p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// FileUnstage removes staging files (the host is done with them). A path
// that is not a staging file is refused; one already gone is no error.
func (a *Agent) FileUnstage(ctx context.Context, paths []string) (int, error) {
	const op = "file unstage"
	for _, p := range paths {
		if !a.isStagePath(p) {
			return 0, invalidf("%s: %q is not a staging file of file stage", op, p)
		}
	}
	removed := 0
	for _, p := range paths {
		if err := os.Remove(p); err == nil {
			removed++
		} else if !errors.Is(err, os.ErrNotExist) {
			return removed, fileErr(op, p, err)
		}
	}
	return removed, nil
}

func (a *Agent) isStagePath(p string) bool {
	return filepath.Clean(p) == p && filepath.Dir(p) == a.xferDir() && stageName.MatchString(filepath.Base(p))
}

func (a *Agent) removeStale() {
	ents, err := os.ReadDir(a.xferDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		if info, err := e.Info(); err == nil && stageName.MatchString(e.Name()) && time.Since(info.ModTime()) > stageTTL {
			_ = os.Remove(filepath.Join(a.xferDir(), e.Name()))
		}
	}
}

// openStaged opens a staging file file stage made, for reading, and removes
// its name (the open descriptor keeps the data). It must hold size bytes.
func (a *Agent) openStaged(op, p string, size int64) (*os.File, error) {
	if !a.isStagePath(p) {
		return nil, invalidf("%s: --from %q is not a staging file of file stage", op, p)
	}
	if err := a.checkXferDir(op); err != nil {
		return nil, err
	}
	fd, err := openNoFollow(op, p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	_ = os.Remove(p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fileErr(op, p, err)
	}
	if typeOf(&st) != "file" || st.Size != size {
		f.Close()
		return nil, invalidf("%s: staging file %s holds %d bytes (type %s); want %d", op, p, st.Size, typeOf(&st), size)
	}
	return f, nil
}

// Output modes of --out.
const (
	outDefault = ""       // the command's own way (file read without --raw: base64 in the reply)
	outInline  = "inline" // after the reply's line on stdout
	outStage   = "stage"  // in staging files
	outAuto    = "auto"   // inline up to wire.InlineMax, staged beyond
)

// dataIO is one command's bulk data: what it reads (stdin, or the staged
// pieces of --in one after another) and where its data output goes.
type dataIO struct {
	a     *Agent
	in    io.Reader
	files []*os.File // the --in pieces, open, their names removed
	sizes []int64
	mode  string
	out   *dataSink // made by the first command that writes data
}

// dataFlags takes the leading --in and --out flags off args.
func (a *Agent) dataFlags(args []string, stdin io.Reader) (*dataIO, []string, error) {
	d := &dataIO{a: a, in: stdin}
	for len(args) >= 2 && (args[0] == "--in" || args[0] == "--out") {
		flag, val := args[0], args[1]
		args = args[2:]
		if flag == "--out" {
			switch val {
			case outInline, outStage, outAuto:
				d.mode = val
			default:
				return d, nil, invalidf("--out %q: want inline, stage or auto", val)
			}
			continue
		}
		if err := d.openIn(val); err != nil {
			return d, nil, err
		}
	}
	return d, args, nil
}

// openIn opens the pieces of --in P1:N1,P2:N2,...
func (d *dataIO) openIn(spec string) error {
	const op = "--in"
	if len(d.files) > 0 {
		return invalidf("%s given twice", op)
	}
	parts := strings.Split(spec, ",")
	if len(parts) > wire.MaxPieces {
		return invalidf("%s: %d pieces; the limit is %d", op, len(parts), wire.MaxPieces)
	}
	for _, part := range parts {
		p, n, ok := strings.Cut(part, ":")
		size, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil || size < 0 || size > wire.PieceBytes {
			return invalidf("%s: %q: want PATH:SIZE with a size of 0..%d", op, part, wire.PieceBytes)
		}
		f, err := d.a.openStaged(op, p, size)
		if err != nil {
			return err
		}
		d.files, d.sizes = append(d.files, f), append(d.sizes, size)
	}
	d.in = d.reader()
	return nil
}

// staged reports whether the input is staged pieces (seekable, of a known size).
func (d *dataIO) staged() bool { return len(d.files) > 0 }

// inSize is the staged input's length.
func (d *dataIO) inSize() int64 {
	var n int64
	for _, s := range d.sizes {
		n += s
	}
	return n
}

// reader reads the staged pieces from the start, one after another.
func (d *dataIO) reader() *sizedReader {
	rs := make([]io.Reader, len(d.files))
	for i, f := range d.files {
		rs[i] = io.NewSectionReader(f, 0, d.sizes[i])
	}
	return &sizedReader{Reader: io.MultiReader(rs...), size: d.inSize()}
}

// sizedReader is input whose exact length is known before it is read
// (Size, as bytes.Reader and io.SectionReader have it).
type sizedReader struct {
	io.Reader
	size int64
}

func (s *sizedReader) Size() int64 { return s.size }

// close releases the input pieces and, when the command failed, removes
// the output it staged.
func (d *dataIO) close(failed bool) {
	for _, f := range d.files {
		f.Close()
	}
	if d.out != nil && failed {
		d.out.discard()
	}
}

// writer is the command's data output, failing past max bytes.
func (d *dataIO) writer(op string, max int64) *dataSink {
	if d.out == nil {
		d.out = &dataSink{a: d.a, op: op, mode: d.mode, max: max}
	}
	return d.out
}

// dataSink collects a command's data output: in memory (inline, and auto
// until wire.InlineMax) or in staging files of at most wire.PieceCap.
type dataSink struct {
	a      *Agent
	op     string
	mode   string
	max    int64
	n      int64
	buf    bytes.Buffer
	pieces []wire.Piece
	cur    *os.File
	curN   int64
}

// errOverMax is wrapped by a write past the sink's maximum.
var errOverMax = errors.New("output over its limit")

func (s *dataSink) Write(p []byte) (int, error) {
	if s.n+int64(len(p)) > s.max {
		return 0, fmt.Errorf("%s: %w of %d bytes", s.op, errOverMax, s.max)
	}
	if s.mode == outStage || s.mode == outAuto && s.buf.Len()+len(p) > wire.InlineMax || s.cur != nil {
		if err := s.spill(); err != nil {
			return 0, err
		}
		if err := s.stage(p); err != nil {
			return 0, err
		}
	} else {
		s.buf.Write(p)
	}
	s.n += int64(len(p))
	return len(p), nil
}

// spill moves what is buffered into staging files.
func (s *dataSink) spill() error {
	if s.buf.Len() == 0 {
		return nil
	}
	b := s.buf.Bytes()
	s.buf = bytes.Buffer{}
	return s.stage(b)
}

func (s *dataSink) stage(p []byte) error {
	for len(p) > 0 {
		if s.cur == nil || s.curN == wire.PieceCap(len(s.pieces)-1) {
			if err := s.next(); err != nil {
				return err
			}
		}
		n := min(int64(len(p)), wire.PieceCap(len(s.pieces)-1)-s.curN)
		if _, err := s.cur.Write(p[:n]); err != nil {
			return fileErr(s.op, s.cur.Name(), err)
		}
		s.curN += n
		s.pieces[len(s.pieces)-1].Bytes = s.curN
		p = p[n:]
	}
	return nil
}

// next closes the current staging file and opens a new one.
func (s *dataSink) next() error {
	if s.cur != nil {
		if err := s.cur.Close(); err != nil {
			return fileErr(s.op, s.cur.Name(), err)
		}
	}
	if len(s.pieces) == wire.MaxPieces {
		return fmt.Errorf("%s: %w: more than %d staging files", s.op, errOverMax, wire.MaxPieces)
	}
	if len(s.pieces) == 0 {
		if err := s.a.checkXferDir(s.op); err != nil {
			return err
		}
	}
	f, err := s.a.newStaged(s.op)
	if err != nil {
		return err
	}
	s.cur, s.curN = f, 0
	s.pieces = append(s.pieces, wire.Piece{Path: f.Name()})
	return nil
}

// finish closes the staging files and says where the data is; inline data
// is returned to follow the reply's line.
func (s *dataSink) finish() (*wire.DataOut, []byte, error) {
	if s.cur != nil {
		if err := s.cur.Close(); err != nil {
			return nil, nil, fileErr(s.op, s.cur.Name(), err)
		}
		s.cur = nil
	}
	if len(s.pieces) > 0 {
		return &wire.DataOut{Bytes: s.n, Staged: s.pieces}, nil, nil
	}
	return &wire.DataOut{Bytes: s.n}, s.buf.Bytes(), nil
}

// discard removes what was staged.
func (s *dataSink) discard() {
	if s.cur != nil {
		s.cur.Close()
		s.cur = nil
	}
	for _, p := range s.pieces {
		_ = os.Remove(p.Path)
	}
	s.pieces = nil
}
