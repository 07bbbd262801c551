package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/argview"
)

// inlineMax: a value shorter than this, on one line, is printed after its
// name; anything else as a block of lines each marked "|", so that no
// value can print a line that looks like the command's own.
const inlineMax = 100

// writeApproval prints one approval and every argument of its call, as
// the server rendered them (argview: control and format characters
// escaped, binary as a hex dump).
func writeApproval(w io.Writer, a server.ApprovalView) {
	fmt.Fprintf(w, "%s  %s  grant %s  tool %s  vm %s\n", a.ID, a.State, a.Grant, a.Tool, orDash(a.VM))
	fmt.Fprintf(w, "  created %s, expires %s", a.Created.Local().Format(time.DateTime), a.Expires.Local().Format(time.DateTime))
	if a.DecidedBy != "" {
		fmt.Fprintf(w, ", decided by %s", a.DecidedBy)
		if a.Reason != "" {
			fmt.Fprintf(w, ": %s", a.Reason)
		}
	}
	fmt.Fprintln(w)
	switch {
	case a.Redacted:
		fmt.Fprintln(w, "  arguments (redacted: the call's full arguments are no longer kept):")
	case len(a.Arguments) == 0:
		fmt.Fprintln(w, "  no arguments")
	default:
		fmt.Fprintln(w, "  arguments, exactly as the call will run with them:")
	}
	cut := false
	for _, f := range a.Arguments {
		writeField(w, f)
		cut = cut || f.Truncated()
	}
	if cut {
		fmt.Fprintf(w, "  some arguments are cut; see all of them: vmgate approvals show %s\n", a.ID)
	}
}

// writeField prints one argument.
func writeField(w io.Writer, f argview.Field) {
	var about []string
	switch f.Kind {
	case argview.KindHex:
		about = append(about, "binary, hex dump")
	case argview.KindText:
		about = append(about, "text")
	}
	about = append(about, plural(f.Bytes, "byte"))
	if f.Truncated() {
		about = append(about, fmt.Sprintf("first %d shown", f.Shown))
	}
	if f.Escaped > 0 {
		about = append(about, plural(f.Escaped, "hidden character")+` shown as \x.. or \u{..}`)
	}
	head := fmt.Sprintf("    %s (%s)", f.Name, strings.Join(about, ", "))
	if f.Kind == argview.KindJSON {
		head = "    " + f.Name
	}
	if f.Kind != argview.KindHex && !strings.Contains(f.Value, "\n") && len(f.Value) <= inlineMax {
		fmt.Fprintf(w, "%s: %s\n", head, f.Value)
		return
	}
	fmt.Fprintf(w, "%s:\n", head)
	lines := strings.Split(f.Value, "\n")
	if len(lines) > 1 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	for _, l := range lines {
		fmt.Fprintf(w, "      | %s\n", l)
	}
	if f.Truncated() {
		fmt.Fprintf(w, "      | … %d more bytes\n", f.Bytes-f.Shown)
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
