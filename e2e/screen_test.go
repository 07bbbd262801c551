package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// ocrHelperEnv, set, makes the test binary read a PNG on stdin and print
// its text (hypervisortest.OCR, tesseract): screen.test.mjs's OCR.
const ocrHelperEnv = "VMGATE_E2E_OCR_HELPER"

func ocrMain() int {
	png, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := testload.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	text, err := hypervisortest.OCR(ctx, png)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(text)
	return 0
}

// screenPolicy is the grant "screen": the four screen and console tools
// without approval, vm_status, and vm_agent_exec (to stop the guest agent).
const screenPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_status": {}, "vm_agent_exec": {},
    "vm_screenshot": {}, "vm_send_keys": {}, "vm_console_read": {}, "vm_console_write": {}
  }
}
`

// TestNodeSDKScreen runs screen.test.mjs (the official MCP SDK over stdio)
// on the lab VM: the console shows the boot, then, with the guest agent
// stopped, text typed with vm_send_keys on tty1 is read back from
// vm_screenshot by OCR and a command written to the serial root shell
// answers in vm_console_read; keys typed under the built-in policy wait
// for an operator, who sees the text in full. The agent is continued
// through the console by the script, and by the test if the script failed.
func TestNodeSDKScreen(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "screen.json"), []byte(screenPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cfg := fmt.Sprintf(`state_dir: %q
grants:
  - name: screen
    policy: screen.json
    vms: ["lab/*"]
  - name: builtin
    policy: %s
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q, console: %q, console_log: %q}
`, state, config.BuiltinPolicy, vmName, vm.QMPSocket, vm.QGASocket, vm.ConsoleSocket, vm.SerialLog)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Whatever the script did, the shared VM's agent runs afterwards.
	t.Cleanup(func() { continueAgent(t, vm.ConsoleSocket) })
	runNode(t, node, append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName, "VMGATE_E2E_OCR="+self), "screen.test.mjs")
	guestRun(t, vm, "/bin/true") // the agent answers again
}

// continueAgent writes kill -CONT for the guest agent to the serial root
// shell straight on the console socket (vmgate serve has exited).
func continueAgent(t *testing.T, socket string) {
	c, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		t.Logf("console socket: %v", err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "kill -CONT $(pidof qemu-ga)\n"); err != nil {
		t.Logf("console socket: %v", err)
	}
}
