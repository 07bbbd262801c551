package libvirt

import (
	"testing"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// TestConsoleBootAndNoAgent, on the persistent domain (as TestPower): the
// console opened before a reset shows the kernel's boot messages; then,
// with the guest agent stopped, the screen, the keys and the console
// still work through libvirt.
func TestConsoleBootAndNoAgent(t *testing.T) {
	_, d := envDriver(t, Config{})
	h := hypervisortest.Harness{Driver: d, VM: vmT1, Capabilities: libvirtCapabilities}
	t.Run("Boot", func(t *testing.T) { hypervisortest.RunConsoleBoot(t, h) })
	h.StopAgent = hypervisortest.StopAgentByExec(h)
	h.ResumeAgent = hypervisortest.ResumeAgentByConsole(h)
	t.Run("WithoutAgent", func(t *testing.T) { hypervisortest.RunWithoutAgent(t, h) })
}
