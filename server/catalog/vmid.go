package catalog

import (
	"strings"

	"github.com/vmgate/vmgate/config"
)

// maxVMNameBytes bounds the name part of a VM id.
const maxVMNameBytes = 255

// ValidVMID reports whether id is "<backend>/<name>" with a backend name
// (config.ValidBackendName) and a name of the safe charset: ASCII letters, digits
// and "._-+@:(), " (no glob or shell characters, no slashes, no control or
// non-ASCII characters), not beginning with '-', '.' or a space, not ending
// with a space and holding no "..". Every tool's vm goes through it before
// any driver call; list_vms leaves out the VMs whose ids fail it, so no VM
// is listed that cannot be called.
func ValidVMID(id string) bool {
	backend, name, ok := strings.Cut(id, "/")
	if !ok || !config.ValidBackendName(backend) || name == "" || len(name) > maxVMNameBytes {
		return false
	}
	if name[0] == '-' || name[0] == '.' || name[0] == ' ' || name[len(name)-1] == ' ' || strings.Contains(name, "..") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-+@:(), ", c) >= 0) {
			return false
		}
	}
	return true
}
