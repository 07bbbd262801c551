package archtest

import (
	"go/ast"
	"testing"
)

// maxFuncLines is the longest a production function (or function literal)
// may be anywhere in the repository: a longer one becomes named steps. A
// table (a function that only returns a composite literal) is exempt.
const maxFuncLines = 80

// longFunc is a function over the limit.
type longFunc struct {
	at    string // file:line
	name  string
	lines int
}

// longFuncs lists the functions of f longer than max lines.
func longFuncs(pf productionFile, max int) []longFunc {
	var out []longFunc
	ast.Inspect(pf.f, func(n ast.Node) bool {
		var body *ast.BlockStmt
		name := "func literal"
		switch fn := n.(type) {
		case *ast.FuncDecl:
			body, name = fn.Body, fn.Name.Name
		case *ast.FuncLit:
			body = fn.Body
		}
		if body == nil || isTable(body) {
			return true
		}
		start := pf.fset.Position(n.Pos())
		if lines := pf.fset.Position(body.Rbrace).Line - start.Line + 1; lines > max {
			out = append(out, longFunc{at: pf.rel + ":" + itoa(start.Line), name: name, lines: lines})
		}
		return true
	})
	return out
}

// isTable reports whether body only returns a composite literal.
func isTable(body *ast.BlockStmt) bool {
	if len(body.List) != 1 {
		return false
	}
	ret, ok := body.List[0].(*ast.ReturnStmt)
	if !ok || len(ret.Results) != 1 {
		return false
	}
	_, ok = ret.Results[0].(*ast.CompositeLit)
	return ok
}

// TestNoLongFunctions reads every production Go file of the repository and
// reports the functions longer than maxFuncLines.
func TestNoLongFunctions(t *testing.T) {
	for _, pf := range productionFiles(t) {
		for _, lf := range longFuncs(pf, maxFuncLines) {
			t.Errorf("%s: %s is %d lines; the limit is %d (split it into named steps)", lf.at, lf.name, lf.lines, maxFuncLines)
		}
	}
}
