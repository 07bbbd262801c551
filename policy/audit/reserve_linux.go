package audit

import (
	"os"
	"syscall"
)

// fallocKeepSize is FALLOC_FL_KEEP_SIZE: reserve blocks without changing
// the file's size.
const fallocKeepSize = 0x1

// reserveBlocks reserves the file system blocks of f's bytes [off, off+n)
// past its end, leaving its size (and so what readers see) as it is.
func reserveBlocks(f *os.File, off, n int64) error {
	return syscall.Fallocate(int(f.Fd()), fallocKeepSize, off, n)
}
