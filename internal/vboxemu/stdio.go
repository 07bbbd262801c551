package vboxemu

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
)

// DefaultStdoutBuffer is the size of stdout's stdio buffer when stdout is
// a pipe: VBoxManage prints through IPRT's RTPrintf, which on Linux writes
// to the C library's stdout (src/VBox/Runtime/r3/stream.cpp: without
// RTSTREAM_STANDALONE g_StdOut.pFile is stdout, written with
// fwrite_unlocked). glibc buffers a stream that is not a terminal fully,
// in a buffer of st_blksize bytes capped at BUFSIZ (libio/filedoalloc.c
// _IO_file_doallocate); a pipe reports 4096.
const DefaultStdoutBuffer = 4096

// bufferedStdout is glibc's fully buffered stdout: writes collect in a
// buffer of size n that is written out whole when the next write does not
// fit (libio/fileops.c _IO_new_file_xsputn: fill the buffer, flush it, then
// write whole blocks directly "to maintain alignment" and buffer the rest),
// and at exit. So VBoxManage's own lines reach the pipe in n-byte blocks
// whose boundaries fall anywhere in a line, or at exit.
type bufferedStdout struct {
	w   io.Writer // the process's fd 1
	n   int
	buf []byte
}

func newBufferedStdout(w io.Writer, n int) *bufferedStdout {
	if n <= 0 {
		n = DefaultStdoutBuffer
	}
	return &bufferedStdout{w: w, n: n}
}

// Write is fwrite: it never writes a partial block except at Flush.
func (b *bufferedStdout) Write(p []byte) (int, error) {
	total := len(p)
	room := b.n - len(b.buf)
	if len(p) <= room {
		b.buf = append(b.buf, p...)
		return total, nil
	}
	b.buf = append(b.buf, p[:room]...)
	p = p[room:]
	if err := b.flushBuffer(); err != nil {
		return total - len(p), err
	}
	if whole := len(p) - len(p)%b.n; whole > 0 {
		if _, err := b.w.Write(p[:whole]); err != nil {
			return total - len(p), err
		}
		p = p[whole:]
	}
	b.buf = append(b.buf, p...)
	return total, nil
}

func (b *bufferedStdout) flushBuffer() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Flush is what exit() does to stdout.
func (b *bufferedStdout) Flush() error { return b.flushBuffer() }

// tee copies everything written to the process's stdout or stderr for the
// invocation log, in the order the pipe would carry it.
type tee struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
}

func (t *tee) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	return t.w.Write(p)
}

func (t *tee) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// printf is RTPrintf: through the buffered stdout.
func (e *emu) printf(format string, args ...any) {
	fmt.Fprintf(e.stdout, format, args...)
}

// msg is IPRT's rtMsgWorker (src/VBox/Runtime/common/misc/message.cpp):
// each line of the formatted message is printed as "VBoxManage: <prefix>
// <line>"; an empty line stays empty. stderr is unbuffered.
func (e *emu) msg(prefix, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	if text == "" || text == "\n" {
		io.WriteString(e.stderr, "\n")
		return
	}
	var sb strings.Builder
	for {
		line, rest, found := strings.Cut(text, "\n")
		if line == "" && found {
			sb.WriteString("\n")
		} else {
			fmt.Fprintf(&sb, "VBoxManage: %s%s\n", prefix, line)
		}
		if !found || rest == "" {
			break
		}
		text = rest
	}
	io.WriteString(e.stderr, sb.String())
}

// errorf is RTMsgError.
func (e *emu) errorf(format string, args ...any) { e.msg("error: ", format, args...) }

// warningf is RTMsgWarning.
func (e *emu) warningf(format string, args ...any) { e.msg("warning: ", format, args...) }

// showLogo is VBoxManageHelp.cpp showLogo: once per process.
func (e *emu) showLogo(w io.Writer) {
	if e.logoShown {
		return
	}
	e.logoShown = true
	io.WriteString(w, e.v.Logo())
}

// Exit codes (include/iprt/types.h RTEXITCODE).
const (
	exitSuccess = 0
	exitFailure = 1
	exitSyntax  = 2
)

// syntaxError is errorSyntax. 7.x (VBoxManageHelp.cpp errorSyntaxV): the
// logo, the message, an empty line and the brief usage of the current
// (sub)command, on stderr. 6.1's guestcontrol and the legacy commands
// (errorSyntaxEx/errorSyntax(USAGECATEGORY...)) print the logo, the usage,
// then "Syntax error: <message>"; 6.1's refentry-converted commands print
// like 7.x. The usage text itself is generated from the manual's refentry
// sources at build time; the emulator leaves it out.
func (e *emu) syntaxError(format string, args ...any) int {
	e.showLogo(e.stderr)
	if e.legacySyntax {
		fmt.Fprintf(e.stderr, "\nSyntax error: %s\n", fmt.Sprintf(format, args...))
		return exitSyntax
	}
	e.errorf(format, args...)
	io.WriteString(e.stderr, "\n")
	return exitSyntax
}

// comError is what CHECK_ERROR prints for a failed call with full error
// info on Linux (src/VBox/Main/glue/errorprint.cpp GluePrintErrorInfo and
// GluePrintErrorContext): the text, the details line, the context line.
func (e *emu) comError(text string, code comCode, component, iface string, site contextSite) {
	e.errorf("%s\nDetails: code %s (%#x), component %s, interface %s, callee nsISupports\n%s",
		text, code.name, code.value, component, iface, site.context(e.v))
}

// comCode is a COM status code name and value (include/VBox/err.h,
// VirtualBox.xidl result codes).
type comCode struct {
	name  string
	value uint32
}

var (
	codeObjectNotFound = comCode{"VBOX_E_OBJECT_NOT_FOUND", 0x80bb0001}
	codeInvalidVMState = comCode{"VBOX_E_INVALID_VM_STATE", 0x80bb0002}
	codeVMError        = comCode{"VBOX_E_VM_ERROR", 0x80bb0003}
	codeIPRTError      = comCode{"VBOX_E_IPRT_ERROR", 0x80bb0005}
	codeInvalidObject  = comCode{"VBOX_E_INVALID_OBJECT_STATE", 0x80bb0007}
	codeFileError      = comCode{"VBOX_E_FILE_ERROR", 0x80bb0004}
	codeInvalidArg     = comCode{"E_INVALIDARG", 0x80070057}
	codeAccessDenied   = comCode{"E_ACCESSDENIED", 0x80070005}
	codeFail           = comCode{"E_FAIL", 0x80004005}
)
