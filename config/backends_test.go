package config

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const grantsDoc = "state_dir: s\ngrants: [{name: a, policy: builtin:default}]\n"

func TestParseBackends(t *testing.T) {
	dir := t.TempDir()
	doc := grantsDoc + `plugin_dir: plugins
backends:
  - name: lab
    driver: qemu
    settings: {lab: true, exec_timeout: 2m, vms: [{name: v1, qmp: q.sock, qga: g.sock}]}
  - name: pve
    driver: proxmox
    settings:
      url: https://pve.example:8006
      token_id: vmgate@pve!agent
      token_secret_file: pve.secret
      exec_timeout: 30s
  - name: vbox
    driver: virtualbox
    in_process: true
    settings: {username: vagrant, password_file: /etc/vbox.pw, guest_temp_dir: /var/tmp}
  - name: fire
    driver: firecracker
    settings: {sockets: [a, b], depth: 3, nested: {ok: true, none: null}}
  - name: bare
    driver: firecracker
  - name: virt
    driver: libvirt
    settings:
      uri: qemu:///system?socket=/run/libvirt/libvirt-sock
      name_glob: vmgate-*
      metadata_uri: https://vmgate.example/libvirt
      exec_timeout: 5m
      info_ttl: 2s
      dial_timeout: 3s
  - name: virt-default
    driver: libvirt
`
	c, err := Parse([]byte(doc), dir, "")
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	if c.PluginDir != filepath.Join(dir, "plugins") {
		t.Errorf("PluginDir = %q; want it resolved against the config dir", c.PluginDir)
	}
	want := []map[string]any{
		{"lab": true, "lab_dir": filepath.Join(dir, "s", "lab"), "exec_timeout": "2m0s",
			"vms": []any{map[string]any{"name": "v1", "qmp": filepath.Join(dir, "q.sock"), "qga": filepath.Join(dir, "g.sock")}}},
		{"url": "https://pve.example:8006", "token_id": "vmgate@pve!agent", "token_secret_file": filepath.Join(dir, "pve.secret"), "exec_timeout": "30s"},
		{"username": "vagrant", "password_file": "/etc/vbox.pw", "guest_temp_dir": "/var/tmp"},
		{"sockets": []any{"a", "b"}, "depth": float64(3), "nested": map[string]any{"ok": true, "none": nil}},
		{},
		{"uri": "qemu:///system?socket=/run/libvirt/libvirt-sock", "name_glob": "vmgate-*", "metadata_uri": "https://vmgate.example/libvirt",
			"exec_timeout": "5m0s", "info_ttl": "2s", "dial_timeout": "3s"},
		{},
	}
	if len(c.Backends) != len(want) {
		t.Fatalf("len(Backends) = %d; want %d", len(c.Backends), len(want))
	}
	for i, w := range want {
		var got map[string]any
		if err := json.Unmarshal(c.Backends[i].DriverConfig, &got); err != nil {
			t.Fatalf("backends[%d].DriverConfig = %s: %v", i, c.Backends[i].DriverConfig, err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("backends[%d].DriverConfig = %v; want %v", i, got, w)
		}
	}
	if !c.Backends[2].InProcess || c.Backends[1].InProcess {
		t.Errorf("InProcess = %v, %v; want false for pve, true for vbox", c.Backends[1].InProcess, c.Backends[2].InProcess)
	}
}

func TestDefaultBackend(t *testing.T) {
	c := Default("/state")
	var got map[string]any
	if err := json.Unmarshal(c.Backends[0].DriverConfig, &got); err != nil {
		t.Fatalf("Default().Backends[0].DriverConfig = %s: %v", c.Backends[0].DriverConfig, err)
	}
	if want := map[string]any{"lab": true, "lab_dir": filepath.Join("/state", "lab")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Default().Backends[0].DriverConfig = %v; want %v", got, want)
	}
}

// Bad settings are refused at load time with the path of the setting.
func TestParseBadBackends(t *testing.T) {
	pve := func(settings string) string {
		return grantsDoc + "backends:\n  - name: lab\n    driver: qemu\n    settings: {lab: true}\n  - name: pve\n    driver: proxmox\n    settings: " + settings + "\n"
	}
	vbox := func(settings string) string {
		return grantsDoc + "backends: [{name: vb, driver: virtualbox, settings: " + settings + "}]\n"
	}
	virt := func(settings string) string {
		return grantsDoc + "backends: [{name: virt, driver: libvirt, settings: " + settings + "}]\n"
	}
	const okPVE = "url: https://h:8006, token_id: u@pve!tk, token_secret_file: s"
	tests := []struct{ name, doc, want string }{
		{"proxmox http url", pve("{url: http://h:8006, token_id: u@pve!tk, token_secret_file: s}"), "backends[1].settings.url: \"http://h:8006\" must be https"},
		{"proxmox no url", pve("{token_id: u@pve!tk, token_secret_file: s}"), "backends[1].settings.url: required (https://host:8006) (line 9)"},
		{"proxmox url with credentials", pve("{url: 'https://root:pw@h', token_id: u@pve!tk, token_secret_file: s}"), "backends[1].settings.url:"},
		{"proxmox unknown setting", pve("{" + okPVE + ", urll: x}"), "backends[1].settings.urll: unknown setting (line 9"},
		{"proxmox misspelt case", pve("{" + okPVE + ", URL: x}"), "backends[1].settings.URL: unknown setting"},
		{"proxmox duplicate key", pve("{" + okPVE + ", url: https://other}"), "backends[1].settings.url: defined twice"},
		{"proxmox bool as string", pve("{" + okPVE + ", insecure_skip_verify: 'yes'}"), "backends[1].settings.insecure_skip_verify: want true or false"},
		{"proxmox url as number", pve("{url: 8006, token_id: u@pve!tk, token_secret_file: s}"), "backends[1].settings.url: want a string, got int \"8006\""},
		{"proxmox bad token id", pve("{url: https://h, token_id: root, token_secret_file: s}"), "backends[1].settings.token_id: \"root\" must be USER@REALM!TOKENID"},
		// The driver's own rule (pve-access-control's): a token id of one character is refused at load time.
		{"proxmox one-character token id", pve("{url: https://h, token_id: u@pve!t, token_secret_file: s}"), "backends[1].settings.token_id: \"u@pve!t\" must be USER@REALM!TOKENID (line 9)"},
		{"proxmox no secret", pve("{url: https://h, token_id: u@pve!tk}"), "backends[1].settings.token_secret_file: required"},
		{"proxmox bad timeout", pve("{" + okPVE + ", exec_timeout: soon}"), "backends[1].settings.exec_timeout:"},
		{"proxmox negative timeout", pve("{" + okPVE + ", exec_timeout: -1s}"), "backends[1].settings.exec_timeout: \"-1s\" must be positive (line 9)"},
		{"proxmox ca and insecure", pve("{" + okPVE + ", ca_file: ca.pem, insecure_skip_verify: true}"), "ca_file and insecure_skip_verify exclude each other"},
		{"proxmox settings a list", pve("[a, b]"), "backends[1].settings: want a mapping"},
		{"proxmox no settings", pve("{}"), "backends[1].settings.url: required"},
		{"proxmox alias", grantsDoc + "backends: [{name: p, driver: proxmox, settings: {url: &u 'https://h', token_id: *u}}]\n", "backends[0].settings.token_id: YAML aliases"},
		{"virtualbox no username", vbox("{password_file: p}"), "backends[0].settings.username: required"},
		{"virtualbox dash username", vbox("{username: '-x', password_file: p}"), "backends[0].settings.username: \"-x\" must not begin"},
		{"virtualbox no password file", vbox("{username: u}"), "backends[0].settings.password_file: required"},
		{"virtualbox relative guest dir", vbox("{username: u, password_file: p, guest_temp_dir: tmp}"), "backends[0].settings.guest_temp_dir:"},
		{"virtualbox unknown", vbox("{username: u, password_file: p, password: hunter2}"), "backends[0].settings.password: unknown setting"},
		{"libvirt unknown setting", virt("{uri: 'qemu:///system', url: x}"), "backends[0].settings.url: unknown setting"},
		{"libvirt misspelt glob", virt("{nameglob: 'vm-*'}"), "backends[0].settings.nameglob: unknown setting"},
		{"libvirt uri as number", virt("{uri: 16509}"), "backends[0].settings.uri: want a string, got int"},
		{"libvirt ssh uri", virt("{uri: 'qemu+ssh://root@h/system'}"), "backends[0].settings.uri: \"qemu+ssh://root@h/system\": not supported by this backend: go-libvirt has no ssh transport"},
		{"libvirt uri bad path", virt("{uri: 'qemu:///root'}"), "backends[0].settings.uri: invalid argument: \"qemu:///root\": path must be /system or /session (line 3)"},
		{"libvirt uri relative socket", virt("{uri: 'qemu:///system?socket=sock'}"), "backends[0].settings.uri: invalid argument: \"qemu:///system?socket=sock\": socket must be one absolute path"},
		{"libvirt uri unknown scheme", virt("{uri: 'xen:///system'}"), "backends[0].settings.uri:"},
		{"libvirt bad glob", virt("{name_glob: 'vm-['}"), "backends[0].settings.name_glob: \"vm-[\": syntax error in pattern (line 3)"},
		{"libvirt metadata uri not a uri", virt("{metadata_uri: vmgate}"), "backends[0].settings.metadata_uri: \"vmgate\": want an absolute URI"},
		{"libvirt metadata uri with markup", virt("{metadata_uri: 'urn:x\"/><evil'}"), "backends[0].settings.metadata_uri:"},
		{"libvirt bad exec timeout", virt("{exec_timeout: soon}"), "backends[0].settings.exec_timeout:"},
		{"libvirt zero info ttl", virt("{info_ttl: 0s}"), "backends[0].settings.info_ttl: \"0s\" must be positive"},
		{"libvirt negative dial timeout", virt("{dial_timeout: -1s}"), "backends[0].settings.dial_timeout: \"-1s\" must be positive"},
		{"libvirt timeout as number", virt("{exec_timeout: 600}"), "backends[0].settings.exec_timeout: want a string, got int"},
		{"libvirt settings a list", virt("[a]"), "backends[0].settings: want a mapping"},
		{"libvirt duplicate key", virt("{uri: 'qemu:///system', uri: 'qemu:///system'}"), "backends[0].settings.uri: defined twice"},
		{"qemu unknown", grantsDoc + "backends: [{name: x, driver: qemu, settings: {lab: true, labs: true}}]\n", "backends[0].settings.labs: unknown setting"},
		{"qemu vm name type", grantsDoc + "backends: [{name: x, driver: qemu, settings: {vms: [{name: [a], qmp: q, qga: g}]}}]\n", "backends[0].settings.vms[0].name: want a string, got a list"},
		{"qemu vm named twice", grantsDoc + "backends:\n  - name: x\n    driver: qemu\n    settings:\n      vms:\n        - {name: a, qmp: q, qga: g}\n        - name: a\n          qmp: q2\n          qga: g2\n",
			"backends[0].settings.vms[1].name: \"a\" defined twice (line 9)"},
		{"qemu vm without qga", grantsDoc + "backends:\n  - name: x\n    driver: qemu\n    settings:\n      vms:\n        - name: a\n          qmp: q\n",
			"backends[0].settings.vms[0].qga: required (the VM's guest agent socket) (line 8)"},
		{"qemu bad vm name", grantsDoc + "backends:\n  - name: x\n    driver: qemu\n    settings:\n      lab: true\n      vms:\n        - {name: '../a', qmp: q, qga: g}\n",
			"backends[0].settings.vms[0].name: \"../a\" is not a valid VM name"},
		{"qemu lab_dir as list", grantsDoc + "backends: [{name: x, driver: qemu, settings: {lab_dir: [a]}}]\n", "backends[0].settings.lab_dir: want a string, got a list"},
		{"qemu nothing", grantsDoc + "backends: [{name: x, driver: qemu}]\n", "backends[0].settings: give vms, lab: true, or both"},
		{"qemu bad info ttl", grantsDoc + "backends: [{name: x, driver: qemu, settings: {lab: true, info_ttl: 0s}}]\n", "backends[0].settings.info_ttl:"},
		{"external without plugin_dir", grantsDoc + "backends: [{name: x, driver: hyperv}]\n", "backends[0].driver: unknown driver \"hyperv\": not built in"},
		{"external in process", grantsDoc + "plugin_dir: p\nbackends: [{name: x, driver: hyperv, in_process: true}]\n", "backends[0].in_process:"},
		{"external bad name", grantsDoc + "plugin_dir: p\nbackends: [{name: x, driver: '../sh'}]\n", "backends[0].driver: \"../sh\" is neither"},
		{"external non-string key", grantsDoc + "plugin_dir: p\nbackends: [{name: x, driver: hyperv, settings: {1: a}}]\n", "backends[0].settings: keys must be strings"},
		{"external NaN", grantsDoc + "plugin_dir: p\nbackends: [{name: x, driver: hyperv, settings: {n: .nan}}]\n", "backends[0].settings.n:"},
		{"external alias", grantsDoc + "plugin_dir: p\nbackends: [{name: x, driver: hyperv, settings: {a: &v 1, b: *v}}]\n", "backends[0].settings.b: YAML aliases"},
		{"backend name with underscore", grantsDoc + "backends: [{name: a_b, driver: qemu, settings: {lab: true}}]\n", "backends[0].name"},
		{"backend name too long", grantsDoc + "backends: [{name: " + strings.Repeat("a", 33) + ", driver: qemu, settings: {lab: true}}]\n", "backends[0].name"},
		{"backend name twice", grantsDoc + "backends: [{name: a, driver: qemu, settings: {lab: true}}, {name: a, driver: qemu, settings: {lab: true}}]\n", "backends[1].name: \"a\" defined twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc), t.TempDir(), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %+v, %v; want an error containing %q", tt.doc, c, err, tt.want)
			}
		})
	}
}
