package vboxemu

import (
	"regexp"
	"strings"
	"testing"
)

// TestExtraDataAndModifyVM: extra data is set, read, copied by clonevm and
// deleted by an empty value; modifyvm sizes a powered-off machine and
// refuses a running one and out-of-range values, in every release.
func TestExtraDataAndModifyVM(t *testing.T) {
	for _, v := range []string{"6.1", "7.0", "7.1"} {
		t.Run(v, func(t *testing.T) {
			h := newTestHost(t, &World{Version: v, VMs: []*Machine{offMachine("vm1", uuid1)}})
			steps := []struct {
				args []string
				code int
				out  string // a regexp the stdout must match
				err  string // a substring of stderr
			}{
				{[]string{"getextradata", "vm1", "vmgate/lease"}, 0, `^No value set!\n$`, ""},
				{[]string{"setextradata", "vm1", "vmgate/lease", "L-0123456789"}, 0, `^$`, ""},
				{[]string{"getextradata", "vm1", "vmgate/lease"}, 0, `^Value: L-0123456789\n$`, ""},
				{[]string{"getextradata", "vm1", "enumerate"}, 0, `^Key: vmgate/lease, Value: L-0123456789\n$`, ""},
				{[]string{"getextradata", "nope", "vmgate/lease"}, 1, `^$`, "Could not find a registered machine named 'nope'"},
				{[]string{"setextradata", "nope", "k", "v"}, 1, `^$`, "Could not find a registered machine named 'nope'"},
				{[]string{"setextradata", "vm1"}, 2, `^$`, "Not enough parameters"},
				{[]string{"setextradata", "vm1", "a", "b", "c"}, 2, `^$`, "Too many parameters"},
				{[]string{"setextradata", "vm1", "bad\x01key", "v"}, 1, `^$`, "E_INVALIDARG"},
				{[]string{"getextradata", "vm1", "a", "b"}, 2, `^$`, "Incorrect number of parameters"},
				{[]string{"snapshot", "vm1", "take", "base"}, 0, `^Snapshot taken`, ""},
				{[]string{"clonevm", "vm1", "--name", "c1", "--register", "--snapshot", "base", "--options", "link"}, 0, `^Machine has been successfully cloned as "c1"\n$`, ""},
				{[]string{"getextradata", "c1", "vmgate/lease"}, 0, `^Value: L-0123456789\n$`, ""},
				{[]string{"clonevm", "vm1", "--name", "c2", "--register", "--uuid", "{6D1F6A2C-0B7E-4C9E-9A51-3F0F6A8F00C2}"}, 0, `^Machine has been successfully cloned as "c2"\n$`, ""},
				{[]string{"showvminfo", "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f00c2", "--machinereadable"}, 0, `(?m)^name="c2"$`, ""},
				{[]string{"clonevm", "vm1", "--name", "c3", "--register", "--uuid", "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f00c2"}, 1, `^$`, "Registered machine with UUID {6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f00c2}"},
				{[]string{"clonevm", "vm1", "--name", "c3", "--register", "--uuid", "not-a-uuid"}, 2, `^$`, "Invalid argument format: not-a-uuid"},
				{[]string{"unregistervm", "c2", "--delete"}, 0, `^$`, ""},
				{[]string{"setextradata", "c1", "vmgate/lease"}, 0, `^$`, ""},
				{[]string{"getextradata", "c1", "vmgate/lease"}, 0, `^No value set!\n$`, ""},
				{[]string{"getextradata", "vm1", "vmgate/lease"}, 0, `^Value: L-0123456789\n$`, ""},
				{[]string{"modifyvm", "c1", "--memory", "256", "--cpus", "2"}, 0, `^$`, ""},
				{[]string{"showvminfo", "c1", "--machinereadable"}, 0, `(?m)^memory=256\ncpus=2$`, ""},
				{[]string{"modifyvm", "c1", "--memory", "2"}, 1, `^$`, "Invalid RAM size: 2 MB (must be in range [4, 2097152] MB)"},
				{[]string{"modifyvm", "c1", "--cpus", "65"}, 1, `^$`, "Invalid virtual CPU count: 65 (must be in range [1, 64])"},
				{[]string{"modifyvm", "c1", "--memory", "lots"}, 1, `^$`, "Invalid argument format: lots"},
				{[]string{"modifyvm", "c1", "--memory", "300", "--bogus", "9"}, 1, `^$`, "Unknown option: --bogus"},
				{[]string{"startvm", "vm1", "--type", "headless"}, 0, `successfully started`, ""},
				{[]string{"snapshot", "vm1", "take", "live"}, 0, `^Snapshot taken`, ""},
				{[]string{"controlvm", "vm1", "poweroff"}, 0, `^$`, ""},
				{[]string{"clonevm", "vm1", "--name", "c4", "--register", "--snapshot", "live"}, 0, `^Machine has been successfully cloned as "c4"\n$`, ""},
				{[]string{"showvminfo", "c4", "--machinereadable"}, 0, `(?m)^VMState="saved"$`, ""},
				{[]string{"modifyvm", "c4", "--memory", "300"}, 1, `^$`, "The machine is not mutable (state is Saved)"},
				{[]string{"unregistervm", "c4", "--delete"}, 0, `^$`, ""},
				{[]string{"modifyvm", "nope", "--memory", "256"}, 1, `^$`, "Could not find a registered machine named 'nope'"},
				{[]string{"startvm", "c1", "--type", "headless"}, 0, `successfully started`, ""},
				{[]string{"modifyvm", "c1", "--memory", "512"}, 1, `^$`, "The machine 'c1' is already locked for a session (or being unlocked)"},
				{[]string{"setextradata", "c1", "vmgate/lease", "L-again-0001"}, 0, `^$`, ""},
				{[]string{"getextradata", "c1", "vmgate/lease"}, 0, `^Value: L-again-0001\n$`, ""},
			}
			for _, s := range steps {
				code, out, errs := h.run(s.args...)
				if code != s.code || !regexp.MustCompile(s.out).MatchString(out) || !strings.Contains(errs, s.err) {
					t.Fatalf("VBoxManage %q = %d\nstdout %q\nstderr %q\nwant %d, stdout ~ %q, stderr containing %q", s.args, code, out, errs, s.code, s.out, s.err)
				}
			}
			if m := h.world().find("c1"); m == nil || m.MemoryMB != 256 || m.CPUs != 2 {
				t.Errorf("c1 after modifyvm = %+v; want 256 MB and 2 CPUs", m)
			}
		})
	}
}
