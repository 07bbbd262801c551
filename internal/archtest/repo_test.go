package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory: where go.mod is, above this
// package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no repository root (go.mod beside .git) above this package")
		}
		dir = parent
	}
}

// skippedDir reports whether the walk leaves out the directory name: what
// is not Go source of the repository.
func skippedDir(name string) bool {
	return name == "node_modules" || name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".")
}

// productionFile is one parsed non-test, non-generated Go file.
type productionFile struct {
	rel  string // slash-separated, from the repository root
	fset *token.FileSet
	f    *ast.File
	src  []byte
}

// productionFiles parses every non-test, hand-written Go file of the
// repository (the bench module's too).
func productionFiles(t *testing.T) []productionFile {
	t.Helper()
	root := repoRoot(t)
	var out []productionFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skippedDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, productionFile{rel: filepath.ToSlash(rel), fset: fset, f: f, src: src})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 100 {
		t.Fatalf("read %d production files; want the repository's", len(out))
	}
	return out
}
