package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// The lab VMs of the package: vm1 carries the load and the sentinels, vm2
// is the one that gets paused and loses its agent.
const (
	vm1 = "chaos1"
	vm2 = "chaos2"
)

// ModeEnv selects the long form: VMGATE_CHAOS=long.
const ModeEnv = "VMGATE_CHAOS"

// mode is the size of a run.
type mode struct {
	name       string
	clients    int           // concurrent MCP clients under load
	load       time.Duration // how long the load runs
	kills      int           // kill -9 rounds
	killEvery  time.Duration // load between two kills
	replicaCli int           // clients per replica
	flood      time.Duration // how long the initialize flood runs (FloodEnv overrides it)
}

var (
	shortMode = mode{name: "short", clients: 16, load: 15 * time.Second, kills: 3, killEvery: 3 * time.Second, replicaCli: 4, flood: 10 * time.Second}
	longMode  = mode{name: "long", clients: 64, load: 60 * time.Second, kills: 10, killEvery: 4 * time.Second, replicaCli: 16, flood: 60 * time.Second}
)

func currentMode() mode {
	if os.Getenv(ModeEnv) == "long" {
		return longMode
	}
	return shortMode
}

var (
	workDir   string // the run's temporary directory (binaries)
	buildOnce sync.Once
	vmgateBin string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmgate-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	workDir = dir
	code := labtest.Main(m, lab.Spec{Name: vm1}, lab.Spec{Name: vm2})
	report.print(os.Stdout)
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds vmgate (and the amd64 guest helper beside it, which the
// server pushes into guests) once per run.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		bin := filepath.Join(workDir, "vmgate")
		builds := [][]string{
			{"build", "-o", bin, "github.com/vmgate/vmgate/cmd/vmgate"},
			{"build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(workDir, "vmgate-guest-linux-amd64"), "github.com/vmgate/vmgate/cmd/vmgate-guest"},
		}
		for i, args := range builds {
			cmd := exec.Command("go", args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if i == 1 {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
		vmgateBin = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return vmgateBin
}

// reportTable collects the rows the suite prints at the end.
type reportTable struct {
	mu   sync.Mutex // guards rows
	rows [][3]string
}

var report reportTable

// add records one row: the part of the campaign, what was measured, the figure.
func (r *reportTable) add(part, what, figure string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, [3]string{part, what, figure})
}

func (r *reportTable) print(w *os.File) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nvmgate reliability campaign (%s form)\n", currentMode().name)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PART\tCHECK\tRESULT")
	for _, row := range r.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", row[0], row[1], row[2])
	}
	tw.Flush()
}
