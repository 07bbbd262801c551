package virtualbox

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

// TestTranscripts runs the parsers and the error mapping over real
// VBoxManage output quoted in public material (testdata/transcripts.txtar,
// each example with its source).
func TestTranscripts(t *testing.T) {
	raw, err := os.ReadFile("testdata/transcripts.txtar")
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]string{}
	for _, f := range parseTxtar(string(raw)) {
		data[f.Name] = f.Data
	}
	for name := range data {
		if base, _, _ := strings.Cut(name, "."); data[base+".source"] == "" {
			t.Errorf("transcript %s has no .source section", name)
		}
	}
	errOf := func(name string) error {
		return vboxError("test", result{stderr: []byte(data[name+".stderr"]), code: 1})
	}
	if err := errOf("com-server"); errors.Is(err, hypervisor.ErrVMNotRunning) || !strings.Contains(err.Error(), "VBoxSVC") {
		t.Errorf("com-server: %v; want an error about VBoxSVC, not %v", err, hypervisor.ErrVMNotRunning)
	}
	for _, n := range []string{"not-ready-session", "not-ready-process", "handle-warnings"} {
		if err := errOf(n); !errors.Is(err, hypervisor.ErrAgentUnavailable) || !errors.Is(err, errControlNotReady) {
			t.Errorf("%s: %v; want %v and %v", n, err, hypervisor.ErrAgentUnavailable, errControlNotReady)
		}
	}
	if err := errOf("copy-failed"); errors.Is(err, hypervisor.ErrVMNotRunning) || !strings.Contains(err.Error(), "File copy failed") || strings.Contains(err.Error(), "Details:") {
		t.Errorf("copy-failed: %v; want VBoxManage's words without the details lines", err)
	}
	kv := ParseMachineReadable([]byte(data["showvminfo.stdout"]))
	if kv["groups"] != "/" || kv["ostype"] != "Windows 10 (64-bit)" || kv["UUID"] != "1bf3464d-57c6-4d49-92a9-a5cc3816b7e7" {
		t.Errorf("showvminfo: %v; want groups, ostype and UUID", kv)
	}
	if names, err := ParseListVMs([]byte(data["runningvms.stdout"])); err != nil || strings.Join(names, "|") != "ol7|win8" {
		t.Errorf("runningvms: %q, %v; want ol7, win8", names, err)
	}
}
