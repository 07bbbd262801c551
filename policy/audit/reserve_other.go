//go:build !linux

package audit

import (
	"errors"
	"os"
)

// reserveBlocks is not supported here: appends allocate as they go.
func reserveBlocks(f *os.File, off, n int64) error {
	return errors.ErrUnsupported
}
