package virtualbox

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// glibcStdout models VBoxManage's buffered stdout for the tests (the same
// rule as internal/vboxemu: whole blocks when the buffer fills, the rest at
// exit), writing into the shared pipe.
type glibcStdout struct {
	pipe  *bytes.Buffer
	block int
	buf   []byte
}

func (g *glibcStdout) printf(format string, args ...any) {
	p := []byte(fmt.Sprintf(format, args...))
	for len(p) > 0 {
		room := g.block - len(g.buf)
		n := min(room, len(p))
		g.buf = append(g.buf, p[:n]...)
		p = p[n:]
		if len(g.buf) == g.block && len(p) > 0 {
			g.pipe.Write(g.buf)
			g.buf = g.buf[:0]
		}
	}
}

func (g *glibcStdout) exit() { g.pipe.Write(g.buf) }

// transcript builds one run's stdout: VBoxManage's verbose text through
// the buffered stdout, the guest's output written straight through between
// loop iterations.
type transcript struct {
	modern  bool
	spec    runSpecText
	session int
	pid     int
	spins   []int    // spin lines before each guest write
	guest   [][]byte // guest writes
	trailer string   // the trailer line
}

func (t transcript) render(block int) []byte {
	var pipe bytes.Buffer
	out := &glibcStdout{pipe: &pipe, block: block}
	if t.modern {
		out.printf("Executing:\n  Image : %s\n", t.spec.image)
		for i, a := range t.spec.args {
			out.printf("  arg[%d]: %s\n", i, a)
		}
	}
	out.printf("Creating guest session as user '%s'...\n", t.spec.user)
	out.printf("Waiting for guest session to start...\n")
	out.printf("Successfully started guest session (ID %d)\n", t.session)
	if t.spec.timeout == 0 {
		out.printf("Starting guest process ...\n")
	} else {
		out.printf("Starting guest process (within %dms)\n", t.spec.timeout)
	}
	out.printf("Process '%s' (PID %d) started\n", t.spec.image, t.pid)
	wait := func(text string, n int) {
		if t.modern {
			out.printf("Wait result is '%s' (%d)\n", text, n)
		} else {
			out.printf("waitResult: %d\n", n)
		}
	}
	wait("started", 1)
	for i, g := range t.guest {
		for range t.spins[i] {
			wait("waiting flag not supported", 9)
		}
		pipe.Write(g)
	}
	wait("terminated", 2)
	out.printf("Process terminated\n")
	out.printf("%s", t.trailer)
	out.printf("Closing guest session ...\n")
	out.exit()
	return pipe.Bytes()
}

// feed runs s through a filter in writes of random sizes.
func feed(t *testing.T, g verboseGrammar, block int, s []byte, r *rand.Rand) (*vfilter, []byte, int64) {
	t.Helper()
	var out bytes.Buffer
	var seen int64
	f := newVFilter(&g, &out, block, func(pid int64) { seen = pid })
	for len(s) > 0 {
		n := min(len(s), 1+r.IntN(3000))
		f.Write(s[:n])
		s = s[n:]
	}
	f.Close()
	return f, out.Bytes(), seen
}

func randomGuest(r *rand.Rand, n int) []byte {
	const alphabet = "Wait result is 'waiting flag not supported' (9)\nProcess terminated\nExit code=0\x00\xff abc\n"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}

// TestVFilterRandom: whatever the block size and however the blocks fall
// between the guest's writes, the filter returns exactly the guest's output
// and the status the trailer gives.
func TestVFilterRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 400 {
		modern := i%2 == 0
		block := []int{512, 1024, 4096, 8192}[r.IntN(4)]
		spec := runSpecText{user: "vagrant", image: "/bin/sh", args: []string{"/bin/sh", "-c", "echo 'x'\nprintf y", "sh", ""}, timeout: int64(r.IntN(2)) * 630000}
		tr := transcript{modern: modern, spec: spec, session: 1 + r.IntN(30), pid: 100 + r.IntN(100000),
			trailer: fmt.Sprintf("Exit code=%d (Status=500 [successfully terminated])\n", r.IntN(256))}
		var want []byte
		for range r.IntN(6) {
			g := randomGuest(r, r.IntN(3*block))
			tr.guest = append(tr.guest, g)
			tr.spins = append(tr.spins, r.IntN(300))
			want = append(want, g...)
		}
		s := tr.render(block)
		g := newVerboseGrammar(modern, spec)
		f, got, seen := feed(t, g, block, s, r)
		if !bytes.Equal(got, want) {
			d := firstDiffBytes(got, want)
			t.Fatalf("case %d (modern %v, block %d): guest output %d bytes, first difference at %d; want %d bytes\ngot  %q\nwant %q", i, modern, block, len(got), d, len(want), got[max(0, d-60):min(len(got), d+40)], want[max(0, d-60):min(len(want), d+40)])
		}
		if !f.done() || f.m.pid != int64(tr.pid) || seen != int64(tr.pid) || f.m.trailer != "exit" {
			t.Fatalf("case %d: done %v, pid %d (callback %d), trailer %q; want done, pid %d, exit", i, f.done(), f.m.pid, seen, f.m.trailer, tr.pid)
		}
	}
}

func firstDiffBytes(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestVFilterTrailers: each ending VBoxManage can print is read.
func TestVFilterTrailers(t *testing.T) {
	spec := runSpecText{user: "u", image: "/bin/true", args: []string{"/bin/true"}}
	for _, tc := range []struct {
		trailer, name string
		code, status  int
	}{
		{"Exit code=255 (Status=500 [successfully terminated])\n", "exit", 255, 500},
		{"Exit code=9 (Status=510 [terminated by signal])\n", "exit", 9, 510},
		{"Process timed out (guest side) and was terminated\n", "guest-timeout", 0, 0},
		{"Process timed out (guest side) and failed to terminate so far\n", "guest-timeout", 0, 0},
		{"Process monitor loop timed out\n", "host-timeout", 0, 0},
		{"Process execution aborted!\n", "aborted", 0, 0},
		{"Process monitor loop quit with vrc=VERR_CALLBACK_RETURN\n", "quit", 0, 0},
	} {
		for _, modern := range []bool{false, true} {
			tr := transcript{modern: modern, spec: spec, session: 3, pid: 42, trailer: tc.trailer,
				guest: [][]byte{[]byte("out\n")}, spins: []int{5}}
			f, got, _ := feed(t, newVerboseGrammar(modern, spec), 4096, tr.render(4096), rand.New(rand.NewPCG(1, 2)))
			if string(got) != "out\n" || !f.done() || f.m.trailer != tc.name || f.m.code != tc.code || f.m.status != tc.status {
				t.Errorf("trailer %q (modern %v): out %q, done %v, trailer %q, code %d, status %d; want %q, done, %q, %d, %d",
					tc.trailer, modern, got, f.done(), f.m.trailer, f.m.code, f.m.status, "out\n", tc.name, tc.code, tc.status)
			}
		}
	}
}

// TestVFilterPIDEarly: once a block with the preamble has passed, the pid
// is known while the process still runs.
func TestVFilterPIDEarly(t *testing.T) {
	spec := runSpecText{user: "u", image: "/bin/sleep", args: []string{"/bin/sleep", "9"}}
	var pipe bytes.Buffer
	out := &glibcStdout{pipe: &pipe, block: 4096}
	out.printf("Executing:\n  Image : /bin/sleep\n  arg[0]: /bin/sleep\n  arg[1]: 9\n")
	out.printf("Creating guest session as user 'u'...\nWaiting for guest session to start...\nSuccessfully started guest session (ID 1)\nStarting guest process ...\nProcess '/bin/sleep' (PID 777) started\n")
	for range 100 {
		out.printf("Wait result is 'waiting flag not supported' (9)\n")
	}
	var seen int64
	g := newVerboseGrammar(true, spec)
	f := newVFilter(&g, &bytes.Buffer{}, 4096, func(pid int64) { seen = pid })
	f.Write(pipe.Bytes())
	if seen != 777 {
		t.Errorf("pid after the first block = %d; want 777", seen)
	}
}

// TestVFilterLookalikes: guest output that looks like VBoxManage's lines,
// short of a whole block, stays the guest's.
func TestVFilterLookalikes(t *testing.T) {
	spec := runSpecText{user: "u", image: "/bin/cat", args: []string{"/bin/cat", "log"}}
	fake := strings.Repeat("Wait result is 'waiting flag not supported' (9)\n", 40) + "Process terminated\nExit code=0 (Status=500 [successfully terminated])\nClosing guest session ...\n"
	tr := transcript{modern: true, spec: spec, session: 1, pid: 5, trailer: "Exit code=3 (Status=500 [successfully terminated])\n",
		guest: [][]byte{[]byte(fake), []byte("W"), []byte(fake)}, spins: []int{200, 0, 150}}
	f, got, _ := feed(t, newVerboseGrammar(true, spec), 4096, tr.render(4096), rand.New(rand.NewPCG(3, 4)))
	want := fake + "W" + fake
	if string(got) != want || !f.done() || f.m.code != 3 {
		t.Errorf("lookalike output: got %d bytes (first difference %d), done %v, code %d; want the guest's %d bytes, done, code 3",
			len(got), firstDiffBytes(got, []byte(want)), f.done(), f.m.code, len(want))
	}
}

// TestVFilterUnparsable: text that is not VBoxManage's leaves the filter
// not done (the driver then reports it instead of guessing).
func TestVFilterUnparsable(t *testing.T) {
	spec := runSpecText{user: "u", image: "/bin/true", args: []string{"/bin/true"}}
	g := newVerboseGrammar(true, spec)
	var out bytes.Buffer
	f := newVFilter(&g, &out, 4096, nil)
	f.Write([]byte("Ausführung:\n  Abbild : /bin/true\n"))
	f.Close()
	if f.done() {
		t.Errorf("filter done on translated text; want not done")
	}
}

func TestStripWrapperWarnings(t *testing.T) {
	drv := "WARNING: The vboxdrv kernel module is not loaded. Either there is no module\n         available for the current kernel (6.1.0-17-amd64) or it failed to\n         load. Please recompile the kernel module and install it by\n\n           sudo /sbin/vboxconfig\n\n         You will not be able to start VMs until this problem is fixed.\n"
	env := "WARNING: Environment variable LOGNAME or USER does not correspond to effective user id.\n"
	for _, tc := range []struct{ in, want string }{
		{drv + env + "\"vm\" {uuid}\n", "\"vm\" {uuid}\n"},
		{env + "7.1.6r167084\n", "7.1.6r167084\n"},
		{"hello\n" + env, "hello\n" + env},
		{"", ""},
	} {
		if got := string(stripWrapperWarnings([]byte(tc.in))); got != tc.want {
			t.Errorf("stripWrapperWarnings(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}
