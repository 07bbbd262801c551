package libvirt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/vmgate/vmgate/guest/qga"
)

// maxFileChunk is the most file data one agent command carries through
// libvirt. qga.Agent moves files in qga.FileChunkBytes (256 KiB) pieces,
// which the agent socket takes; through libvirt, commands of about 200 KB
// of JSON and more stall until libvirt's agent timeout (found with
// libvirt 9.0 and a TCG guest, while 130 KB always passed), so the
// Caller cuts guest-file-write into pieces of this size, and guest-file-read
// too (its replies are as large; not seen failing, cut for the same margin).
const maxFileChunk = 48 << 10

type fileWriteArgs struct {
	Handle int64  `json:"handle"`
	BufB64 string `json:"buf-b64"`
	Count  *int64 `json:"count,omitempty"`
	data   []byte // decoded BufB64, cut to Count
}

type fileReadArgs struct {
	Handle int64 `json:"handle"`
	Count  int64 `json:"count"`
}

// strictArgs re-decodes a command's arguments into v, refusing unknown
// fields (anything unexpected is sent through unchanged instead).
func strictArgs(args, v any) bool {
	b, err := json.Marshal(args)
	if err != nil {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v) == nil
}

// bigFileWrite reports whether args is a guest-file-write with more than
// maxFileChunk bytes of data, and parses it.
func bigFileWrite(args any) (fileWriteArgs, bool) {
	var fw fileWriteArgs
	if !strictArgs(args, &fw) || base64.StdEncoding.DecodedLen(len(fw.BufB64)) <= maxFileChunk {
		return fw, false
	}
	data, err := base64.StdEncoding.DecodeString(fw.BufB64)
	if err != nil {
		return fw, false // let the agent refuse it
	}
	if fw.Count != nil {
		if *fw.Count < 0 || *fw.Count > int64(len(data)) {
			return fw, false
		}
		data = data[:*fw.Count]
	}
	fw.data = data
	return fw, len(data) > maxFileChunk
}

// bigFileRead reports whether args is a guest-file-read of more than
// maxFileChunk bytes, and parses it.
func bigFileRead(args any) (fileReadArgs, bool) {
	var fr fileReadArgs
	return fr, strictArgs(args, &fr) && fr.Count > maxFileChunk
}

// splitWrite writes fw's data in maxFileChunk pieces and answers as one
// guest-file-write would: the total count and the last piece's eof. A short
// piece ends the write early with the count so far.
func (a agentCaller) splitWrite(ctx context.Context, fw fileWriteArgs, result any) error {
	var total int64
	var eof bool
	for off := 0; off < len(fw.data); {
		piece := fw.data[off:min(off+maxFileChunk, len(fw.data))]
		var r struct {
			Count int64 `json:"count"`
			EOF   bool  `json:"eof"`
		}
		args := struct {
			Handle int64  `json:"handle"`
			BufB64 string `json:"buf-b64"`
		}{fw.Handle, base64.StdEncoding.EncodeToString(piece)}
		if err := a.call(ctx, "guest-file-write", args, &r); err != nil {
			return err
		}
		if r.Count < 0 || r.Count > int64(len(piece)) {
			return fmt.Errorf("libvirt: agent: guest-file-write: %w: count %d for %d bytes", qga.ErrProtocol, r.Count, len(piece))
		}
		total += r.Count
		off += int(r.Count)
		eof = r.EOF
		if r.Count < int64(len(piece)) {
			break
		}
	}
	return reply("guest-file-write", map[string]any{"count": total, "eof": eof}, result)
}

// splitRead reads fr.Count bytes in maxFileChunk pieces, stopping at eof or
// a short piece, and answers as one guest-file-read would.
func (a agentCaller) splitRead(ctx context.Context, fr fileReadArgs, result any) error {
	var data []byte
	eof := false
	for int64(len(data)) < fr.Count && !eof {
		want := min(fr.Count-int64(len(data)), maxFileChunk)
		var r struct {
			Count  int64  `json:"count"`
			BufB64 string `json:"buf-b64"`
			EOF    bool   `json:"eof"`
		}
		args := fileReadArgs{Handle: fr.Handle, Count: want}
		if err := a.call(ctx, "guest-file-read", args, &r); err != nil {
			return err
		}
		piece, err := base64.StdEncoding.DecodeString(r.BufB64)
		if err != nil || int64(len(piece)) > want {
			return fmt.Errorf("libvirt: agent: guest-file-read: %w: bad piece (%d bytes for %d, %v)", qga.ErrProtocol, len(piece), want, err)
		}
		data = append(data, piece...)
		eof = r.EOF
		if int64(len(piece)) < want {
			break
		}
	}
	return reply("guest-file-read", map[string]any{
		"count": len(data), "buf-b64": base64.StdEncoding.EncodeToString(data), "eof": eof,
	}, result)
}

// reply hands ret to the caller the way qga.DecodeReply hands a "return".
func reply(command string, ret any, result any) error {
	b, err := json.Marshal(map[string]any{"return": ret})
	if err != nil {
		return fmt.Errorf("libvirt: agent: %s: %w", command, err)
	}
	return qga.DecodeReply(command, b, result)
}
