package archtest

import (
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// parsed is src as a production file named name.
func parsed(t *testing.T, name, src string) productionFile {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	return productionFile{rel: name, fset: fset, f: f, src: []byte(src)}
}

// TestLongFuncsBite: a function or literal over the limit is reported, a
// table of any length and a function at the limit are not.
func TestLongFuncsBite(t *testing.T) {
	body := func(n int) string { return strings.Repeat("\tx++\n", n) }
	src := "package p\n\nvar x int\n\n" +
		"func atLimit() {\n" + body(3) + "}\n\n" + // 5 lines
		"func over() {\n" + body(4) + "}\n\n" + // 6 lines
		"func table() []int {\n\treturn []int{\n" + strings.Repeat("\t\t1,\n", 10) + "\t}\n}\n\n" +
		"func lit() {\n\tf := func() {\n" + body(4) + "\t}\n\tf()\n}\n"
	var got []string
	for _, lf := range longFuncs(parsed(t, "p.go", src), 5) {
		got = append(got, lf.name)
	}
	if want := "over lit func literal"; strings.Join(got, " ") != want {
		t.Errorf("longFuncs = %q; want %q", got, want)
	}
}

// TestMutableExportsBite: an exported variable is reported unless it is a
// sentinel error; unexported ones and blank assertions are not.
func TestMutableExportsBite(t *testing.T) {
	src := `package p

import (
	"errors"
	"fmt"
	"io"
)

var ErrGone = errors.New("gone")
var ErrWrapped = fmt.Errorf("wrapped: %w", ErrGone)
var Table = []string{"a"}
var Limit = 3
var (
	Pair, other = 1, 2
)
var local = 4
var _ io.Reader = nil
`
	var got []string
	for _, v := range mutableExports(parsed(t, "p.go", src)) {
		got = append(got, v.name)
	}
	if want := "Table Limit Pair"; strings.Join(got, " ") != want {
		t.Errorf("mutableExports = %q; want %q", got, want)
	}
}
