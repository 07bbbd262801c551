//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// unitText is the systemd unit of the resident helper for the binary at exe.
func unitText(exe string) string {
	return strings.ReplaceAll(`[Unit]
Description=vmgate-guest, vmgate's resident helper
After=local-fs.target
ConditionPathExists=@EXE@

[Service]
Type=simple
ExecStart=@EXE@ serve
Restart=on-failure
RestartSec=1
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
`, "@EXE@", exe)
}

// systemdRuns reports whether systemd is the guest's init (its own test:
// sd_booted checks /run/systemd/system).
func systemdRuns() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// Install writes the resident helper's systemd unit into unitDir and,
// where systemd runs and start is set, enables and starts it. A guest
// without systemd (busybox init, like the lab image) starts
// `vmgate-guest serve --detach` from its init instead; the reply says so.
func (a *Agent) Install(ctx context.Context, unitDir string, start bool) (wire.Installed, error) {
	exe, err := os.Executable()
	if err != nil {
		return wire.Installed{}, fmt.Errorf("install: %w", err)
	}
	if !filepath.IsAbs(unitDir) {
		return wire.Installed{}, invalidf("install: --unit-dir %q is not absolute", unitDir)
	}
	out := wire.Installed{Unit: filepath.Join(unitDir, UnitName), Systemd: systemdRuns()}
	if err := os.MkdirAll(unitDir, 0o755); err != nil {
		return out, fmt.Errorf("install: %w", err)
	}
	if err := replaceOwnFile(out.Unit, out.Unit+".tmp-"+randomHex(6), []byte(unitText(exe)), 0o644, true); err != nil {
		return out, fmt.Errorf("install: %w", err)
	}
	if !out.Systemd {
		out.Note = "no systemd here: start `" + exe + " serve --detach` from the guest's init"
		return out, nil
	}
	if !start {
		return out, nil
	}
	for _, argv := range [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", "--now", UnitName}} {
		if b, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return out, fmt.Errorf("install: %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(b)))
		}
	}
	out.Started = true
	return out, nil
}
