package libvirt

import (
	"testing"

	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// TestVirtioChannel: the helper's socket is the unix channel whose virtio
// target is the helper's port; another port's channel, a channel of
// another type and XML that does not parse give no socket.
func TestVirtioChannel(t *testing.T) {
	const agent = `<channel type='unix'><source mode='bind' path='/run/qga.sock'/><target type='virtio' name='org.qemu.guest_agent.0'/></channel>`
	for _, tc := range []struct {
		name, xml string
		path      string
		ok        bool
	}{
		{"unix channel", `<domain><devices>` + agent + `<channel type='unix'><source mode='bind' path='/run/h.sock'/><target type='virtio' name='` + helperchan.PortName + `'/></channel></devices></domain>`, "/run/h.sock", true},
		{"pty channel", `<domain><devices><channel type='pty'><target type='virtio' name='` + helperchan.PortName + `'/></channel></devices></domain>`, "", true},
		{"guest agent only", `<domain><devices>` + agent + `</devices></domain>`, "", false},
		{"not virtio", `<domain><devices><channel type='unix'><source path='/run/h.sock'/><target type='guestfwd' name='` + helperchan.PortName + `'/></channel></devices></domain>`, "", false},
		{"not XML", `<domain><devices>`, "", false},
	} {
		if path, ok := virtioChannel(tc.xml, helperchan.PortName); path != tc.path || ok != tc.ok {
			t.Errorf("virtioChannel(%s) = %q, %v; want %q, %v", tc.name, path, ok, tc.path, tc.ok)
		}
	}
	if !hasAgentChannel(`<domain><devices>` + agent + `</devices></domain>`) {
		t.Errorf("hasAgentChannel(a guest agent channel) = false; want true")
	}
}
