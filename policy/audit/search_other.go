//go:build !linux

package audit

import (
	"errors"
	"os"
)

// ErrShrank is returned by a search of a log that became shorter while it
// was read (only the Linux search maps the log, and can notice).
var ErrShrank = errors.New("the log shrank while it was read (the server took back a write that failed); search again")

// mapped does not map here: Search reads the file.
func (s *scanner) mapped(*os.File) (bool, error) { return false, nil }
