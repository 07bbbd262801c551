package proxmox

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// How Proxmox words the failures the driver tells apart (qemu-server,
// pve-access-control, pve-manager sources, as internal/pveemu emulates them).
var (
	// raise_perm_exc: "Permission check failed (PATH, PRIV|PRIV...)".
	permFailedRE = regexp.MustCompile(`^Permission check failed \(([^,]+), ([^)]+)\)`)
	// vm_reset, vm_reboot, mon_cmd: "VM N not running"; assert_agent_available:
	// "VM N is not running".
	notRunningRE = regexp.MustCompile(`^VM \d+ (is )?not running$`)
	// PVE::AbstractConfig::load_config.
	noConfigRE = regexp.MustCompile(`^Configuration file '[^']*' does not exist$`)
)

// classify maps an API error of operation op to the hypervisor sentinels:
// a node that could not be reached is its *NodeError (ErrBackend); a
// refused token or privilege is ErrBackend with Proxmox's reason and what
// to grant; "VM N not running" ErrVMNotRunning; a VM config gone (still,
// after the placement followed a migration) ErrUnknownVM; any other error
// answer ErrBackend with Proxmox's message.
// Agent errors map through agentexec.MapError. The message holds no secret:
// Proxmox's messages name paths, privileges and the token id, never its
// secret.
func (d *Driver) classify(op string, err error) error {
	// A node that could not be reached names itself (it may hold the
	// proxy's APIError).
	if ne := (*NodeError)(nil); errors.As(err, &ne) {
		return fmt.Errorf("proxmox: %s: %w", op, ne)
	}
	var ae *APIError
	if !errors.As(err, &ae) {
		// Any other error reply of the guest agent is its own reason
		// (agentexec.AgentReplyError).
		return fmt.Errorf("proxmox: %s: %w", op, agentexec.MapError(err))
	}
	msg := strings.TrimSpace(ae.Message)
	switch {
	case ae.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("proxmox: %s: %w: %w (%s): %w; check token_id and the secret file",
			op, hypervisor.ErrBackend, ErrAuth, d.tokenID, ae)
	case ae.StatusCode == http.StatusForbidden:
		hint := ""
		if m := permFailedRE.FindStringSubmatch(msg); m != nil {
			hint = fmt.Sprintf("; grant %s on %s to the API token %s", strings.ReplaceAll(m[2], "|", " or "), m[1], d.tokenID)
		}
		return fmt.Errorf("proxmox: %s: %w: %w: %w%s", op, hypervisor.ErrBackend, ErrAuth, ae, hint)
	case notRunningRE.MatchString(msg):
		return fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrVMNotRunning, ae)
	case noConfigRE.MatchString(msg), notOnNodeRE.MatchString(msg):
		return fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrUnknownVM, ae)
	}
	if mapped := agentexec.MapError(err); mapped != err {
		return fmt.Errorf("proxmox: %s: %w", op, mapped)
	}
	return fmt.Errorf("proxmox: %s: %w: %w", op, hypervisor.ErrBackend, ae)
}
