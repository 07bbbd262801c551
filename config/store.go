package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
)

// Sentinel is store.sentinel: the Redis primary that Redis Sentinel
// watches under Master, found through the Sentinels at Addrs and followed
// through failovers (policy/store/redis.OpenSentinel).
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under
	// (`sentinel monitor NAME …` in their configuration).
	Master string `yaml:"master"`
	// Addrs are host:port addresses of Sentinels (three or more on
	// separate hosts; the others are discovered from them).
	Addrs []string `yaml:"addrs"`
	// PasswordFile holds the Redis servers' password (requirepass), one
	// line; relative to the config file. Empty: no password.
	PasswordFile string `yaml:"password_file"`
	// SentinelPasswordFile holds the Sentinels' own password, if they
	// require one.
	SentinelPasswordFile string `yaml:"sentinel_password_file"`
	// AckTimeoutMS bounds how long a write waits for a replica's
	// acknowledgement before the call is refused (0: 250).
	AckTimeoutMS int `yaml:"ack_timeout_ms"`
}

// The bounds of the Sentinel settings.
const (
	MaxSentinelAddrs = 16
	maxAckTimeoutMS  = 10_000
	// MaxPasswordFileSize bounds a password file.
	MaxPasswordFileSize = 1024
)

// masterNameRE is what a Sentinel master name may be here: Sentinel takes
// any word; vmgate keeps to a charset that needs no quoting in its
// configuration file.
var masterNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// validateStore checks the store section; errors name the field and, from
// a file, its line.
func (c *Config) validateStore() error {
	st := c.Store
	switch st.Type {
	case StoreBolt, StoreMemory:
		if st.URL != "" || st.Prefix != "" || st.Sentinel != nil {
			return c.fieldError("store", "url, prefix and sentinel are for type redis, not %s", st.Type)
		}
	case StoreRedis:
		switch {
		case st.URL == "" && st.Sentinel == nil:
			return c.fieldError("store.url", "required for type redis (one server), or store.sentinel (a primary Sentinel watches)")
		case st.URL != "" && st.Sentinel != nil:
			return c.fieldError("store.sentinel", "url and sentinel are two ways to reach Redis: give one")
		case st.Sentinel != nil:
			return c.validateSentinel()
		}
	default:
		return c.fieldError("store.type", "unknown store %q (want bolt, memory or redis)", st.Type)
	}
	return nil
}

func (c *Config) validateSentinel() error {
	sn := c.Store.Sentinel
	if !masterNameRE.MatchString(sn.Master) {
		return c.fieldError("store.sentinel.master", "%q: want the name the Sentinels monitor the primary under ([A-Za-z0-9._-], at most 64)", sn.Master)
	}
	if len(sn.Addrs) == 0 || len(sn.Addrs) > MaxSentinelAddrs {
		return c.fieldError("store.sentinel.addrs", "%d addresses: want 1 to %d Sentinels (three or more on separate hosts)", len(sn.Addrs), MaxSentinelAddrs)
	}
	seen := map[string]int{}
	for i, a := range sn.Addrs {
		field := fmt.Sprintf("store.sentinel.addrs[%d]", i)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return c.fieldError(field, "%q is not host:port", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return c.fieldError(field, "%q: port %q is not a number from 1 to 65535", a, port)
		}
		if j, dup := seen[a]; dup {
			return c.fieldError(field, "%q is also addrs[%d]", a, j)
		}
		seen[a] = i
	}
	if sn.AckTimeoutMS < 0 || sn.AckTimeoutMS > maxAckTimeoutMS {
		return c.fieldError("store.sentinel.ack_timeout_ms", "%d out of range [0, %d] (0 means the default, 250)", sn.AckTimeoutMS, maxAckTimeoutMS)
	}
	return nil
}

// fieldError is the error about field (a path like "store.sentinel.addrs[1]"),
// with the line the config file gives it.
func (c *Config) fieldError(field, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if c.root != nil && len(c.root.Content) == 1 {
		if line := lineOf(c.root.Content[0], field); line > 0 {
			return fmt.Errorf("%s: %s (line %d)", field, msg, line)
		}
	}
	return fmt.Errorf("%s: %s", field, msg)
}

// Passwords reads the password files (an empty string for a file not
// given). Each must be a regular file with no permission bits for group or
// others (0600 or 0400), of one non-empty line (a final newline is
// dropped), at most MaxPasswordFileSize bytes.
func (s *Sentinel) Passwords() (redis, sentinel string, err error) {
	if redis, err = readPasswordFile(s.PasswordFile, "password_file"); err != nil {
		return "", "", err
	}
	if sentinel, err = readPasswordFile(s.SentinelPasswordFile, "sentinel_password_file"); err != nil {
		return "", "", err
	}
	return redis, sentinel, nil
}

// errPasswordFile: a password file is not one a secret may live in.
var errPasswordFile = errors.New("unusable password file")

func readPasswordFile(path, field string) (string, error) {
	if path == "" {
		return "", nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("config: store.sentinel.%s: %s: %s: %w", field, path, fmt.Sprintf(format, args...), errPasswordFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("config: store.sentinel.%s: %w", field, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("config: store.sentinel.%s: %w", field, err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return "", bad("not a regular file")
	case fi.Mode().Perm()&0o077 != 0:
		return "", bad("mode %04o: others may read it (chmod 600)", fi.Mode().Perm())
	}
	raw, err := io.ReadAll(io.LimitReader(f, MaxPasswordFileSize+1))
	if err != nil {
		return "", fmt.Errorf("config: store.sentinel.%s: %w", field, err)
	}
	if len(raw) > MaxPasswordFileSize {
		return "", bad("more than %d bytes", MaxPasswordFileSize)
	}
	raw = bytes.TrimSuffix(bytes.TrimSuffix(raw, []byte("\n")), []byte("\r"))
	switch {
	case len(raw) == 0:
		return "", bad("empty")
	case bytes.ContainsAny(raw, "\r\n\x00"):
		return "", bad("more than one line")
	}
	return string(raw), nil
}
