//go:build unix

package ui

import (
	"os"
	"syscall"
)

// fileID identifies a file across renames (its inode), so a rotated log is
// read from its start.
func fileID(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
