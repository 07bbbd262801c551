package qga

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"
)

const (
	// FileChunkBytes is the size of one guest-file-read or guest-file-write
	// (qemu-ga allows reads up to 48 MiB; smaller chunks keep replies modest
	// and the agent responsive).
	FileChunkBytes = 256 << 10
	// DefaultMaxFileBytes is FileRead's cap when maxBytes is 0.
	DefaultMaxFileBytes = 16 << 20
	// closeTimeout bounds guest-file-close on error paths, where ctx may be done.
	closeTimeout = 2 * time.Second
)

func checkPath(path string) error {
	if path == "" {
		return fmt.Errorf("%w: empty path", ErrInvalidArgument)
	}
	if err := checkString("path", path); err != nil {
		return err
	}
	if path[0] != '/' {
		return fmt.Errorf("%w: path %q is not absolute", ErrInvalidArgument, path)
	}
	return nil
}

// open opens path in mode and returns the handle.
func (a Agent) open(ctx context.Context, path, mode string) (int64, error) {
	var handle *int64
	args := struct {
		Path string `json:"path"`
		Mode string `json:"mode"`
	}{path, mode}
	if err := a.Caller.Call(ctx, "guest-file-open", args, &handle); err != nil {
		return 0, err
	}
	if handle == nil {
		return 0, fmt.Errorf("qga: guest-file-open: %w: reply has no handle", ErrProtocol)
	}
	return *handle, nil
}

// close closes handle, also when ctx is already done.
func (a Agent) close(ctx context.Context, handle int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	args := struct {
		Handle int64 `json:"handle"`
	}{handle}
	return a.Caller.Call(ctx, "guest-file-close", args, nil)
}

// FileRead reads at most maxBytes of path (0: DefaultMaxFileBytes) in
// ChunkBytes chunks. truncated reports whether the file had more.
func (a Agent) FileRead(ctx context.Context, path string, maxBytes int64) (data []byte, truncated bool, err error) {
	if err := checkPath(path); err != nil {
		return nil, false, fmt.Errorf("qga: file read: %w", err)
	}
	if maxBytes < 0 {
		return nil, false, fmt.Errorf("qga: file read: %w: negative max bytes %d", ErrInvalidArgument, maxBytes)
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxFileBytes
	}
	h, err := a.open(ctx, path, "r")
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if cerr := a.close(ctx, h); cerr != nil && err == nil {
			err = cerr
		}
	}()
	want := maxBytes + 1 // one byte more tells whether the file has more
	for int64(len(data)) < want {
		var r struct {
			Count  int    `json:"count"`
			BufB64 string `json:"buf-b64"`
			EOF    bool   `json:"eof"`
		}
		// The last chunk of a file of exactly maxBytes asks for the one
		// byte more with it: qemu-ga then reports EOF on that read, and no
		// further round trip asks for the byte alone.
		count, rest := int64(a.chunkBytes()), want-int64(len(data))
		if rest <= count+1 {
			count = rest
		}
		args := struct {
			Handle int64 `json:"handle"`
			Count  int64 `json:"count"`
		}{h, count}
		if err := a.Caller.Call(ctx, "guest-file-read", args, &r); err != nil {
			return nil, false, err
		}
		chunk, err := base64Decode("guest-file-read", "buf-b64", r.BufB64)
		if err != nil {
			return nil, false, err
		}
		if int64(len(chunk)) > args.Count {
			return nil, false, fmt.Errorf("qga: guest-file-read: %w: %d bytes for a count of %d", ErrProtocol, len(chunk), args.Count)
		}
		data = append(data, chunk...)
		if r.EOF || len(chunk) == 0 {
			break
		}
	}
	if int64(len(data)) > maxBytes {
		return data[:maxBytes], true, nil
	}
	return data, false, nil
}

// FileWrite creates or truncates path and writes data in ChunkBytes
// chunks. mode 0 keeps the agent's default permissions for a new file;
// otherwise the file is then chmod'ed to mode through guest-exec (the agent
// has no mode argument), which needs guest-exec enabled.
func (a Agent) FileWrite(ctx context.Context, path string, data []byte, mode uint32) (err error) {
	if err := checkPath(path); err != nil {
		return fmt.Errorf("qga: file write: %w", err)
	}
	if mode > 0o7777 {
		return fmt.Errorf("qga: file write: %w: mode %#o", ErrInvalidArgument, mode)
	}
	if err := a.writeFile(ctx, path, data); err != nil {
		return err
	}
	if mode == 0 {
		return nil
	}
	st, err := a.Exec(ctx, ExecRequest{Path: "chmod", Args: []string{strconv.FormatUint(uint64(mode), 8), "--", path}, MaxOutputBytes: 4096})
	if err != nil {
		return fmt.Errorf("qga: file write: written, but setting mode %#o failed: %w", mode, err)
	}
	if st.ExitCode != 0 || st.Signal != 0 {
		return fmt.Errorf("qga: file write: written, but chmod %#o failed (status %d): %s", mode, st.ExitCode, st.Stderr)
	}
	return nil
}

func (a Agent) writeFile(ctx context.Context, path string, data []byte) (err error) {
	h, err := a.open(ctx, path, "w")
	if err != nil {
		return err
	}
	defer func() {
		if cerr := a.close(ctx, h); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for len(data) > 0 {
		n := min(len(data), a.chunkBytes())
		var r struct {
			Count int  `json:"count"`
			EOF   bool `json:"eof"`
		}
		args := struct {
			Handle int64  `json:"handle"`
			BufB64 string `json:"buf-b64"`
		}{h, base64.StdEncoding.EncodeToString(data[:n])}
		if err := a.Caller.Call(ctx, "guest-file-write", args, &r); err != nil {
			return err
		}
		if r.Count <= 0 || r.Count > n {
			return fmt.Errorf("qga: guest-file-write: %w: wrote %d of %d bytes", ErrProtocol, r.Count, n)
		}
		data = data[r.Count:]
	}
	return nil
}
