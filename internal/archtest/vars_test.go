package archtest

import (
	"go/ast"
	"go/token"
	"testing"
)

// An exported package-level variable is state any importer can change for
// every other: configuration and tables are functions or constants
// instead. The exceptions are the variables no one means to change:
// sentinel errors (errors.New, fmt.Errorf) and the blank interface
// assertions (var _ I = …), which are not exported.

// exportedVar is an exported package-level variable that is no sentinel.
type exportedVar struct {
	at, name string
}

// mutableExports lists f's exported package-level variables that are not
// sentinel errors.
func mutableExports(pf productionFile) []exportedVar {
	var out []exportedVar
	for _, decl := range pf.f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !n.IsExported() || i < len(vs.Values) && sentinel(vs.Values[i]) {
					continue
				}
				out = append(out, exportedVar{at: pf.rel + ":" + itoa(pf.fset.Position(n.Pos()).Line), name: n.Name})
			}
		}
	}
	return out
}

// sentinel reports whether e makes a sentinel error: errors.New(…) or
// fmt.Errorf(…).
func sentinel(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && (pkg.Name == "errors" && sel.Sel.Name == "New" || pkg.Name == "fmt" && sel.Sel.Name == "Errorf")
}

// TestNoExportedMutableVars reads every production Go file of the
// repository (generated code aside) and reports its exported package-level
// variables that are not sentinel errors.
func TestNoExportedMutableVars(t *testing.T) {
	for _, pf := range productionFiles(t) {
		for _, v := range mutableExports(pf) {
			t.Errorf("%s: exported variable %s: make it a function, a constant or unexported (only sentinel errors may be exported variables)", v.at, v.name)
		}
	}
}
