package catalog

import (
	"strings"

	"github.com/vmgate/vmgate/config"
)

// maxVMNameBytes bounds the name part of a VM id.
const maxVMNameBytes = 255

// vmNameChars are the bytes a VM name may hold: ASCII letters, digits and
// "._-+@:(), ". A table, as list_vms asks about every VM of a fleet.
var vmNameChars = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range []byte("._-+@:(), ") {
		t[c] = true
	}
	return t
}()

// ValidVMID reports whether id is "<backend>/<name>" with a backend name
// (config.ValidBackendName) and a name ValidVMName accepts. Every tool's
// vm goes through it before any driver call; list_vms leaves out the VMs
// whose ids fail it, so no VM is listed that cannot be called.
func ValidVMID(id string) bool {
	backend, name, ok := strings.Cut(id, "/")
	return ok && config.ValidBackendName(backend) && ValidVMName(name)
}

// ValidVMName reports whether name is a VM name of the safe charset:
// ASCII letters, digits and "._-+@:(), " (no glob or shell characters, no
// slashes, no control or non-ASCII characters), at most 255 bytes, not
// beginning with '-', '.' or a space, not ending with a space and holding
// no "..". list_vms checks a backend's name once and each VM's name with
// this.
func ValidVMName(name string) bool {
	if name == "" || len(name) > maxVMNameBytes {
		return false
	}
	if name[0] == '-' || name[0] == '.' || name[0] == ' ' || name[len(name)-1] == ' ' {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !vmNameChars[name[i]] || name[i] == '.' && i+1 < len(name) && name[i+1] == '.' {
			return false
		}
	}
	return true
}
