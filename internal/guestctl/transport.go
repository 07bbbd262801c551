package guestctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// Transport runs one vmgate-guest command with its bulk data, which may be
// larger than one message of the backend's channels. The default one
// (execTransport) uses the driver's exec channel and, for data beyond
// StdinMax in or inlineMax out, staging files moved with the driver's file
// channel; a resident helper with a channel of its own can replace it
// (SetTransport). A Transport is safe for concurrent use.
type Transport interface {
	Call(ctx context.Context, vm string, c Command) (Reply, error)
}

// Command is one vmgate-guest command line and its data.
type Command struct {
	Op   string   // what it is, for errors: "file read"
	Args []string // after the program name, without the data flags
	// In is the command's data input (its stdin); nil for none.
	In []byte
	// Out: the command writes data output (at most MaxOut bytes).
	Out    bool
	MaxOut int64
	// MaxReply bounds the JSON reply.
	MaxReply int64
	// Timeout bounds the command in the guest; 0 is CommandTimeout.
	Timeout time.Duration
	// Progress, when set, is told the bytes of data moved so far and the
	// total as pieces of In or of the output move (done increases; the
	// total of the output is known once the command replied). A transport
	// calls it from the goroutine of Call.
	Progress func(done, total int64)
}

// moved reports done of total to c.Progress, if any.
func (c *Command) moved(done, total int64) {
	if c.Progress != nil {
		c.Progress(done, total)
	}
}

// Reply is a command's JSON reply line and its data output.
type Reply struct {
	Line []byte
	Data []byte
	// Exec is the exec that ran the command (its exit status and stderr,
	// for error reports); zero for a transport without one.
	Exec hypervisor.ExecResult
}

// SetTransport replaces the transport of the file, dir and archive
// commands (nil: back to the exec channel).
func (h *Helper) SetTransport(t Transport) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t == nil {
		t = &execTransport{h: h}
	}
	h.tr = t
}

func (h *Helper) transport() Transport {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tr
}

// inlineMax is the most data output that comes back inline with the reply
// (vmgate-guest --out auto); beyond it, staging files and the file channel
// (see wire.InlineMax for the figures).
const inlineMax = wire.InlineMax

// execTransport is the Transport over the driver's exec and file channels
// (see guest/agent/files_stage.go for the guest's half).
type execTransport struct{ h *Helper }

var _ Transport = (*execTransport)(nil)

func (t *execTransport) Call(ctx context.Context, vm string, c Command) (Reply, error) {
	h := t.h
	timeout := c.Timeout
	if timeout == 0 {
		timeout = CommandTimeout
	}
	maxOut := c.MaxReply + 1<<16
	var staged []wire.Piece
	res, err := t.viaChannel(ctx, vm, c, timeout, maxOut)
	onChannel := err == nil
	if errors.Is(err, errNotSent) {
		args := c.Args
		if c.Out {
			args = append([]string{"--out", "auto"}, args...)
			maxOut += min(c.MaxOut, inlineMax)
		}
		stdin := c.In
		if len(c.In) > StdinMax {
			if staged, err = t.stageIn(ctx, vm, &c); err != nil {
				return Reply{}, err
			}
			args, stdin = append([]string{"--in", pieceList(staged)}, args...), nil
		}
		res, err = h.run(ctx, vm, c.Op, args, stdin, timeout, maxOut)
	}
	if err != nil {
		t.unstage(ctx, vm, c.Op, staged)
		return Reply{}, err
	}
	line, data, _ := bytes.Cut(res.Stdout, []byte("\n"))
	r := Reply{Line: line, Exec: res}
	var env struct {
		OK   bool          `json:"ok"`
		Data *wire.DataOut `json:"data"`
	}
	if json.Unmarshal(line, &env) != nil || !env.OK {
		t.unstage(ctx, vm, c.Op, staged) // what the guest did not take
		return r, nil                    // decodeReply words it
	}
	if !c.Out {
		return r, nil
	}
	r.Data, err = t.dataOut(ctx, vm, c, env.Data, data, res)
	if err == nil && onChannel {
		c.moved(int64(len(r.Data)), int64(len(r.Data))) // all of it, in the one reply
	}
	return r, err
}

// ChannelStdinMax is the most data input a command takes as its stdin
// over the resident helper's channel (one message of the channel, and of
// the driver plugin's gRPC, hypervisor.MaxMessageBytes, with room for the
// envelope); more goes through staging files.
const ChannelStdinMax = 32 << 20

// ChannelOutMax is the most data output a command sends back inline, in
// its one reply, over the resident helper's channel (as ChannelStdinMax).
const ChannelOutMax = ChannelStdinMax

// viaChannel sends a command to the resident helper over its channel when
// its data input is over StdinMax (and at most ChannelStdinMax), the data
// as its stdin in one message, or when it writes data output of at most
// ChannelOutMax, which then comes back inline after the reply's line
// (--out inline): no staging files, no file channel, which moves data as
// base64 in JSON and a call per piece. errNotSent when the VM has no such
// road or nothing took the call (the caller stages the data instead).
func (t *execTransport) viaChannel(ctx context.Context, vm string, c Command, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	bigIn := len(c.In) > StdinMax && len(c.In) <= ChannelStdinMax
	out := c.Out && c.MaxOut <= ChannelOutMax && len(c.In) <= ChannelStdinMax
	if !bigIn && !out {
		return hypervisor.ExecResult{}, errNotSent
	}
	if r := t.h.road(ctx, vm); r.Kind != RoadResident || r.Via != ViaChannel {
		return hypervisor.ExecResult{}, errNotSent
	}
	args := c.Args
	if c.Out {
		args = append([]string{"--out", "inline"}, args...)
		maxOut += c.MaxOut
	}
	total := int64(len(c.In))
	if bigIn {
		c.moved(0, total)
	}
	res, err := t.h.runResident(ctx, vm, c.Op, ViaChannel, args, c.In, timeout, maxOut)
	if err == nil && bigIn {
		c.moved(total, total)
	}
	return res, err
}

// pieceList is --in's value: PATH:SIZE,...
func pieceList(ps []wire.Piece) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.Path + ":" + strconv.FormatInt(p.Bytes, 10)
	}
	return strings.Join(s, ",")
}

// stageIn puts c.In into the guest as staging files of wire.PieceCap
// bytes: file stage makes them (private to vmgate-guest, in a directory
// no one else may enter), the driver's file channel fills them.
func (t *execTransport) stageIn(ctx context.Context, vm string, c *Command) ([]wire.Piece, error) {
	data := c.In
	var sizes []int64
	for rest := int64(len(data)); rest > 0; {
		n := min(rest, wire.PieceCap(len(sizes)))
		sizes, rest = append(sizes, n), rest-n
	}
	if len(sizes) > wire.MaxPieces {
		return nil, invalid(c.Op, "%d bytes of data: more than %d pieces", len(data), wire.MaxPieces)
	}
	n := len(sizes)
	var made []FileInfo
	if err := t.h.call(ctx, vm, "file stage", []string{"file", "stage", "--count", strconv.Itoa(n)}, nil, 0, 1<<20, &made); err != nil {
		return nil, err
	}
	pieces := make([]wire.Piece, 0, n)
	var off int64
	c.moved(0, int64(len(data)))
	for i, f := range made {
		if !stagePath.MatchString(f.Path) || len(made) != n {
			t.unstage(ctx, vm, c.Op, pieces)
			return nil, &ReplyError{Op: "file stage", Cause: fmt.Errorf("staging path %q (%d of %d) is not one of vmgate-guest's", f.Path, len(made), n)}
		}
		piece := data[off : off+sizes[i]]
		pieces = append(pieces, wire.Piece{Path: f.Path, Bytes: int64(len(piece))})
		// Mode 0: the file stays as file stage made it (0600, in a
		// directory private to root), and no driver runs a chmod for it.
		if err := t.h.d.FileWrite(ctx, vm, f.Path, piece, 0); err != nil {
			t.unstage(ctx, vm, c.Op, stagedPieces(made))
			return nil, fmt.Errorf("helper: %s: staging %d bytes (piece %d of %d): %w", c.Op, len(data), i+1, n, err)
		}
		off += sizes[i]
		c.moved(off, int64(len(data)))
	}
	return pieces, nil
}

func stagedPieces(fs []FileInfo) []wire.Piece {
	out := make([]wire.Piece, len(fs))
	for i, f := range fs {
		out[i] = wire.Piece{Path: f.Path}
	}
	return out
}

// dataOut is the command's data output: inline after the reply's line, or
// read from the staging files the reply lists (then removed).
func (t *execTransport) dataOut(ctx context.Context, vm string, c Command, d *wire.DataOut, inline []byte, res hypervisor.ExecResult) ([]byte, error) {
	bad := func(format string, args ...any) error {
		return &ReplyError{Op: c.Op, ExitCode: res.ExitCode, Stderr: res.Stderr, Cause: fmt.Errorf(format, args...)}
	}
	if d == nil || d.Bytes < 0 || d.Bytes > c.MaxOut {
		return nil, bad("data output %+v: want at most %d bytes", d, c.MaxOut)
	}
	if len(d.Staged) == 0 {
		if int64(len(inline)) != d.Bytes {
			return nil, bad("%d bytes of data after the reply, which says %d", len(inline), d.Bytes)
		}
		return inline, nil
	}
	defer t.unstage(ctx, vm, c.Op, d.Staged)
	var total int64
	for _, p := range d.Staged {
		if !stagePath.MatchString(p.Path) || p.Bytes < 0 || p.Bytes > wire.PieceBytes {
			return nil, bad("staged piece %+v is not one of vmgate-guest's", p)
		}
		total += p.Bytes
	}
	if total != d.Bytes || len(inline) != 0 {
		return nil, bad("staged pieces of %d bytes and %d inline; the reply says %d", total, len(inline), d.Bytes)
	}
	out := make([]byte, 0, total)
	c.moved(0, total)
	for i, p := range d.Staged {
		fc, err := t.h.d.FileRead(ctx, vm, p.Path, max(p.Bytes, 1))
		if err != nil {
			return nil, fmt.Errorf("helper: %s: reading staged piece %d of %d: %w", c.Op, i+1, len(d.Staged), err)
		}
		// Truncated is no matter: the piece is as long as the reply says
		// (Proxmox calls a read of exactly its 16 MiB maximum truncated).
		if int64(len(fc.Data)) != p.Bytes {
			return nil, bad("staged piece %s holds %d bytes; the reply says %d", p.Path, len(fc.Data), p.Bytes)
		}
		out = append(out, fc.Data...)
		c.moved(int64(len(out)), total)
	}
	return out, nil
}

// unstage removes staging files (also when ctx is done: they hold data).
func (t *execTransport) unstage(ctx context.Context, vm, _ string, ps []wire.Piece) {
	if len(ps) == 0 {
		return
	}
	args := []string{"file", "unstage"}
	for _, p := range ps {
		args = append(args, "--path", p.Path)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CommandTimeout)
	defer cancel()
	// Best effort: what stays is removed by the next file stage after an
	// hour, and is private to vmgate-guest until then.
	var out map[string]int
	_ = t.h.call(ctx, vm, "file unstage", args, nil, 0, 1<<16, &out)
}

// callData runs c through the transport and decodes its result into out.
func (h *Helper) callData(ctx context.Context, vm string, c Command, out any) ([]byte, error) {
	r, err := h.transport().Call(ctx, vm, c)
	if err != nil {
		return nil, err
	}
	if err := decodeReply(c.Op, r.Exec, r.Line, out); err != nil {
		return nil, err
	}
	return r.Data, nil
}
