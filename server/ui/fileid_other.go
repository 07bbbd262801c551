//go:build !unix

package ui

import "os"

// fileID is 0 where inodes are not known: only truncation is noticed.
func fileID(os.FileInfo) uint64 { return 0 }
