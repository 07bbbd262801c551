package servetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// labVM is the package's lab VM, served as lab/<labVM>.
const labVM = "wire1"

// workDir holds the binaries built for the run.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmgate-servetest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "servetest:", err)
		os.Exit(2)
	}
	workDir = dir
	code := labtest.Main(m, lab.Spec{Name: labVM})
	os.RemoveAll(dir)
	os.Exit(code)
}

// built is one `go build` done once per run.
type built struct {
	once sync.Once
	path string
	err  error
}

var (
	vmgateBuild built
	fakeBuild   built
)

func (b *built) get(t testing.TB, name, pkg string) string {
	t.Helper()
	b.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			b.err = fmt.Errorf("go not on PATH: %w", err)
			return
		}
		b.path = filepath.Join(workDir, name)
		out, err := exec.Command(goBin, "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// vmgateBinary builds cmd/vmgate once per run.
func vmgateBinary(t testing.TB) string {
	return vmgateBuild.get(t, "vmgate", "github.com/vmgate/vmgate/cmd/vmgate")
}

// fakePlugin builds pluginhost's fake external driver once per run and
// links it into dir as vmgate-plugin-NAME for each name (its file name
// picks its behaviour: -badcookie gets the handshake wrong).
func fakePlugin(t testing.TB, dir string, names ...string) {
	t.Helper()
	bin := fakeBuild.get(t, "fakeplugin", "../pluginhost/testdata/fakeplugin")
	for _, n := range names {
		if err := os.Link(bin, filepath.Join(dir, "vmgate-plugin-"+n)); err != nil {
			t.Fatal(err)
		}
	}
}
