package virtualbox

import (
	"bytes"
	"sync"
)

// capped keeps the first limit bytes written and counts the rest.
type capped struct {
	limit int64
	// mu guards buf and n.
	mu  sync.Mutex
	buf []byte
	n   int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - int64(len(c.buf)); room > 0 {
		c.buf = append(c.buf, p[:min(int64(len(p)), room)]...)
	}
	c.n += int64(len(p))
	return len(p), nil
}

func (c *capped) bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf), c.n > c.limit
}
