package virtualbox

import (
	"context"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// The driver registers itself as "virtualbox": the binary links it in with
// a blank import.
func init() {
	registry.Register(Name, func(_ context.Context, s *Settings) (*Driver, error) { return New(s.config()) })
}

// Name is the driver's name in vmgate.yaml.
const Name = "virtualbox"

// Settings are the virtualbox driver's settings: the "settings" of a
// virtualbox backend in vmgate.yaml and the configuration its plugin gets.
type Settings struct {
	// VBoxManage is the program; empty means VBoxManage on PATH.
	VBoxManage   string `json:"vboxmanage,omitempty"`
	Username     string `json:"username"`
	PasswordFile string `json:"password_file"`
	// GuestTempDir is where stdin is staged in the guest; empty means /tmp.
	GuestTempDir string `json:"guest_temp_dir,omitempty"`
	// ExecTimeout; zero means DefaultExecTimeout.
	ExecTimeout registry.Duration `json:"exec_timeout,omitempty"`
	// StdioBlock is VBoxManage's stdout buffer size on a pipe; 0 means
	// DefaultStdioBlock (glibc on Linux). Set it only for a VBoxManage
	// built against another C library.
	StdioBlock int `json:"stdio_block,omitempty"`
}

var (
	_ registry.Settings        = (*Settings)(nil)
	_ registry.Resolver        = (*Settings)(nil)
	_ registry.TemplateChecker = (*Settings)(nil)
)

// CheckTemplate decodes a template's source (TemplateSource) strictly and
// checks it as CreateVM will, without running VBoxManage: whether the
// template VM and its snapshot exist is known only when a VM is made.
func (s *Settings) CheckTemplate(source json.RawMessage) error {
	var src TemplateSource
	if err := hypervisor.DecodeSource(source, &src); err != nil {
		return err
	}
	return src.check()
}

// Resolve makes the password file absolute, and VBoxManage when it is a
// path rather than a name to look up on PATH.
func (s *Settings) Resolve(env registry.Env) {
	s.PasswordFile = env.Abs(s.PasswordFile)
	if strings.Contains(s.VBoxManage, "/") {
		s.VBoxManage = env.Abs(s.VBoxManage)
	}
}

// Validate checks the settings (New finds VBoxManage and reads the
// password file).
func (s *Settings) Validate() error { return s.config().check() }

func (s *Settings) config() Config {
	return Config{VBoxManage: s.VBoxManage, Username: s.Username, PasswordFile: s.PasswordFile,
		GuestTempDir: s.GuestTempDir, ExecTimeout: s.ExecTimeout.D(), StdioBlock: s.StdioBlock}
}

// check validates cfg without touching any file; errors are
// *registry.FieldError named after the settings.
func (cfg Config) check() error {
	switch {
	case cfg.Username == "":
		return registry.Fieldf("username", "required (the guest account commands run as)")
	case strings.HasPrefix(cfg.Username, "-") || strings.ContainsAny(cfg.Username, "\x00\r\n") || !utf8.ValidString(cfg.Username):
		return registry.Fieldf("username", "%q must not begin with '-' or hold NUL or a line break", cfg.Username)
	case cfg.PasswordFile == "":
		return registry.Fieldf("password_file", "required (a file holding the guest account's password)")
	case strings.HasPrefix(cfg.PasswordFile, "-") || strings.ContainsAny(cfg.PasswordFile, "\x00\r\n"):
		return registry.Fieldf("password_file", "%q must be a path", cfg.PasswordFile)
	case cfg.ExecTimeout < 0:
		return registry.Fieldf("exec_timeout", "negative")
	case cfg.StdioBlock < 0 || cfg.StdioBlock > maxStdioBlock:
		return registry.Fieldf("stdio_block", "%d: want 0..%d", cfg.StdioBlock, maxStdioBlock)
	}
	if cfg.GuestTempDir != "" {
		if err := checkGuestPath(cfg.GuestTempDir); err != nil {
			return registry.Within("guest_temp_dir", err)
		}
	}
	return nil
}
