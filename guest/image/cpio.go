package image

import (
	"fmt"
	"io"
)

// cpioWriter writes a cpio archive in the "newc" (SVR4, no CRC) format the
// kernel's initramfs unpacker reads. Timestamps and owners are zero so the
// same entries always give the same bytes.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

// Mode type bits of the newc header.
const (
	cpioTypeDir     = 0o040000
	cpioTypeFile    = 0o100000
	cpioTypeSymlink = 0o120000
	cpioTypeChar    = 0o020000
)

// writeEntry writes one header, name and data. name has no leading slash.
func (c *cpioWriter) writeEntry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) error {
	if c.err != nil {
		return c.err
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioTypeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+4)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	if _, err := c.w.Write(buf); err != nil {
		c.err = fmt.Errorf("cpio: write %s: %w", name, err)
		return c.err
	}
	if len(data) > 0 {
		if _, err := c.w.Write(data); err != nil {
			c.err = fmt.Errorf("cpio: write %s: %w", name, err)
			return c.err
		}
		if n := len(data) % 4; n != 0 {
			if _, err := c.w.Write(make([]byte, 4-n)); err != nil {
				c.err = fmt.Errorf("cpio: write %s: %w", name, err)
				return c.err
			}
		}
	}
	return nil
}

// close writes the trailer entry.
func (c *cpioWriter) close() error {
	return c.writeEntry("TRAILER!!!", 0, nil, 0, 0)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
