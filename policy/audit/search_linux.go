package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"
)

// ErrShrank is returned by a search of a log that became shorter while it
// was read: the server took back a write that failed part way (see
// "Failures" in the package doc). Searching again reads the log as it is.
var ErrShrank = errors.New("the log shrank while it was read (the server took back a write that failed); search again")

// mapped searches file, from its start, through a read-only mapping of it
// instead of read(2) (no copy of the log through a buffer: a search costs
// what looking at the bytes costs). It reports done=false, having read
// nothing, when file cannot be mapped (not at its start, not a regular
// file, empty): Search then reads it. The mapping is of the size the file
// has now: what the server appends later is not seen, as with a read that
// reached the end. Should the file shrink under the mapping, touching its
// lost pages faults: the fault becomes a panic here (SetPanicOnFault),
// recovered into ErrShrank.
func (s *scanner) mapped(file *os.File) (done bool, err error) {
	if pos, err := file.Seek(0, io.SeekCurrent); err != nil || pos != 0 {
		return false, nil
	}
	fi, err := file.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 || fi.Size() > 1<<40 {
		return false, nil
	}
	data, err := syscall.Mmap(int(file.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return false, nil
	}
	defer syscall.Munmap(data)
	_ = syscall.Madvise(data, syscall.MADV_SEQUENTIAL)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if re, ok := r.(runtime.Error); ok && isFault(re) {
				done, err = true, fmt.Errorf("audit: search: %w", ErrShrank)
				return
			}
			panic(r)
		}
	}()
	end := bytes.LastIndexByte(data, '\n') + 1
	if len(s.needles) > 0 {
		s.pick(data[:min(len(data), searchBuf)])
	}
	if err := s.chunk(data[:end], 0); err != nil {
		return true, err
	}
	s.st.Bytes, s.st.Partial = int64(end), int64(len(data)-end)
	return true, nil
}

// isFault reports whether a runtime error is a memory fault (what
// SetPanicOnFault turns a fault into: it has the faulting address).
func isFault(e runtime.Error) bool {
	_, ok := e.(interface{ Addr() uintptr })
	return ok
}
