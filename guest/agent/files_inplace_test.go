//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// failingData has a known size but fails after n bytes (data that was
// complete when the write began and fails while it is copied).
type failingData struct {
	r    io.Reader
	size int64
}

func (f *failingData) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, errors.New("data source failed")
	}
	return n, err
}

func (f *failingData) Size() int64 { return f.size }

func TestFileWriteInPlace(t *testing.T) {
	const old = "0123456789"
	tests := []struct {
		name   string
		o      FileWriteOptions
		data   io.Reader
		want   string // the file afterwards
		at     int64
		code   string // "" success; "any" any error
		reason string
	}{
		{"offset in the middle", FileWriteOptions{Method: WriteAt, Offset: 3, Size: 3}, strings.NewReader("abc"), "012abc6789", 3, "", ""},
		{"offset over the end", FileWriteOptions{Method: WriteAt, Offset: 8, Size: 4}, strings.NewReader("wxyz"), "01234567wxyz", 8, "", ""},
		{"offset at the end", FileWriteOptions{Method: WriteAt, Offset: 10, Size: 2}, strings.NewReader("++"), "0123456789++", 10, "", ""},
		{"offset past the end: no holes", FileWriteOptions{Method: WriteAt, Offset: 11, Size: 1}, strings.NewReader("x"), old, 0, wire.CodeInvalid, ""},
		{"negative offset", FileWriteOptions{Method: WriteAt, Offset: -1, Size: 1}, strings.NewReader("x"), old, 0, wire.CodeInvalid, ""},
		{"append", FileWriteOptions{Method: WriteAppend, Size: 3}, strings.NewReader("end"), old + "end", 10, "", ""},
		{"append, short data", FileWriteOptions{Method: WriteAppend, Size: 5}, strings.NewReader("end"), old, 0, wire.CodeInvalid, ""},
		{"offset, long data", FileWriteOptions{Method: WriteAt, Offset: 1, Size: 2}, strings.NewReader("abc"), old, 0, wire.CodeInvalid, ""},
		{"offset, stdin-like data spooled", FileWriteOptions{Method: WriteAt, Offset: 1, Size: 2}, io.MultiReader(strings.NewReader("a"), strings.NewReader("b")), "0ab3456789", 1, "", ""},
		{"offset, stdin-like data short", FileWriteOptions{Method: WriteAt, Offset: 1, Size: 3}, io.MultiReader(strings.NewReader("ab")), old, 0, wire.CodeInvalid, ""},
		{"expect matches", FileWriteOptions{Method: WriteAppend, Size: 1, ExpectSHA256: sha([]byte(old))}, strings.NewReader("!"), old + "!", 10, "", ""},
		{"expect differs", FileWriteOptions{Method: WriteAt, Offset: 0, Size: 1, ExpectSHA256: sha([]byte("other"))}, strings.NewReader("!"), old, 0, wire.CodeRefused, wire.ReasonChanged},
		{"data fails mid-way: old bytes back", FileWriteOptions{Method: WriteAt, Offset: 2, Size: 6}, &failingData{r: strings.NewReader("abc"), size: 6}, old, 0, "any", ""},
		{"data fails mid-way over the end: old size back", FileWriteOptions{Method: WriteAt, Offset: 8, Size: 6}, &failingData{r: strings.NewReader("abcd"), size: 6}, old, 0, "any", ""},
		{"append fails mid-way: cut back", FileWriteOptions{Method: WriteAppend, Size: 6}, &failingData{r: strings.NewReader("abc"), size: 6}, old, 0, "any", ""},
	}
	for _, tc := range tests {
		ft := newFileTree(t)
		a := newFileAgent(t)
		p := filepath.Join(ft.ok, "plain")
		os.WriteFile(p, []byte(old), 0o640)
		before, _ := os.Stat(p)
		tc.o.Mode = -1
		got, err := a.FileWrite(context.Background(), p, tc.o, tc.data)
		switch {
		case tc.code == "" && (err != nil || got.Offset != tc.at || got.Bytes != tc.o.Size || got.Atomic || got.Size != int64(len(tc.want))):
			t.Errorf("%s: FileWrite = %+v, %v; want offset %d, %d bytes, size %d, not atomic", tc.name, got, err, tc.at, tc.o.Size, len(tc.want))
		case tc.code == "any" && err == nil:
			t.Errorf("%s: FileWrite = nil error; want the data's failure", tc.name)
		case tc.code != "" && tc.code != "any":
			if msg := refusal(err, tc.code, tc.reason, ""); msg != "" {
				t.Errorf("%s: FileWrite = %v; %s", tc.name, err, msg)
			}
		}
		b, _ := os.ReadFile(p)
		after, _ := os.Stat(p)
		if string(b) != tc.want || !os.SameFile(before, after) || after.Mode().Perm() != 0o640 {
			t.Errorf("%s: file = %q (same inode %v, %v); want %q in the same inode, 0640", tc.name, b, os.SameFile(before, after), after.Mode(), tc.want)
		}
	}
	// Into what is not there, or must not be written.
	ft := newFileTree(t)
	a := newFileAgent(t)
	for _, tc := range []struct{ path, code, reason string }{
		{filepath.Join(ft.ok, "missing"), wire.CodeNotFound, ""},
		{filepath.Join(ft.ok, "link"), wire.CodeRefused, wire.ReasonSymlink},
		{filepath.Join(ft.ok, "hard"), wire.CodeRefused, wire.ReasonHardlink},
		{filepath.Join(ft.ok, "suid"), wire.CodeRefused, wire.ReasonSpecialBits},
		{filepath.Join(ft.ok, "fifo"), wire.CodeRefused, wire.ReasonNotRegular},
	} {
		for _, m := range []WriteMethod{WriteAt, WriteAppend} {
			_, err := a.FileWrite(context.Background(), tc.path, FileWriteOptions{Mode: -1, Method: m, Size: 1}, strings.NewReader("x"))
			if msg := refusal(err, tc.code, tc.reason, ""); msg != "" {
				t.Errorf("FileWrite(%s, method %d) = %v; %s", tc.path, m, err, msg)
			}
		}
	}
	ft.secretIntact(t)
	if _, err := os.Lstat(filepath.Join(ft.ok, "missing")); !os.IsNotExist(err) {
		t.Errorf("an append created a missing file (%v)", err)
	}
	// Hash after an append reads the whole file.
	p := filepath.Join(ft.ok, "plain")
	got, err := a.FileWrite(context.Background(), p, FileWriteOptions{Mode: -1, Method: WriteAppend, Size: 2, Hash: true}, bytes.NewReader([]byte("!!")))
	if err != nil || got.SHA256 != sha([]byte("plain!!")) {
		t.Errorf("append with --hash = %+v, %v; want the hash of plain!!", got, err)
	}
}
