package archtest

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The server's rooms stay small enough to read: no package under server/
// over maxServerPackageLines lines of production code, no production file
// there over maxServerFileLines, and server/gate.go holds the gate's steps
// only.
const (
	maxServerPackageLines = 4000
	maxServerFileLines    = 500
)

func itoa(n int) string { return strconv.Itoa(n) }

// TestServerSizes checks the server's packages and files against the
// limits above.
func TestServerSizes(t *testing.T) {
	byPkg := map[string]int{}
	for _, pf := range productionFiles(t) {
		if !within(pf.rel, "server") {
			continue
		}
		lines := bytes.Count(pf.src, []byte("\n"))
		if lines > maxServerFileLines {
			t.Errorf("%s is %d lines; the limit under server/ is %d (split it by what it does)", pf.rel, lines, maxServerFileLines)
		}
		byPkg[path.Dir(pf.rel)] += lines
	}
	if len(byPkg) < 5 {
		t.Fatalf("found %d packages under server/; want the server's", len(byPkg))
	}
	for pkg, n := range byPkg {
		if n > maxServerPackageLines {
			t.Errorf("%s has %d lines of production code; the limit is %d (give a seam its own package)", pkg, n, maxServerPackageLines)
		}
	}
}

// gateFuncs are what server/gate.go may declare: the one chokepoint, the
// steps of gateSteps and the hand-over of a call that passed them.
var gateFuncs = []string{"gateMessage", "decode", "validate", "resolve", "decide", "approve", "reserve", "record", "pass"}

// TestGateHoldsTheStepsOnly: every function of server/gate.go is one of
// gateFuncs, and each of gateSteps' steps is there.
func TestGateHoldsTheStepsOnly(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, repoRoot(t)+"/server/gate.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok {
			got = append(got, fn.Name.Name)
			if !slices.Contains(gateFuncs, fn.Name.Name) {
				t.Errorf("server/gate.go declares %s; it holds the gate's steps only (%s): put the rest beside what it serves",
					fn.Name.Name, strings.Join(gateFuncs, ", "))
			}
		}
	}
	for _, want := range gateFuncs {
		if !slices.Contains(got, want) {
			t.Errorf("server/gate.go lacks %s", want)
		}
	}
}
