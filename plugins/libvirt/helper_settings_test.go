package libvirt

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/plugins/internal/helperchan/chantest"
)

// TestHelperSilenceLimitSetting: helper_silence_limit reaches the helper
// channel's connections (30 s when unset); one out of bounds is refused,
// naming the setting, before anything is connected.
func TestHelperSilenceLimitSetting(t *testing.T) {
	for _, tt := range chantest.SilenceCases() {
		config := `{}`
		if tt.Setting != "" {
			config = `{"helper_silence_limit":` + tt.Setting + `}`
		}
		d, err := registry.New(context.Background(), Name, []byte(config))
		if c, ok := d.(hypervisor.Closer); ok {
			defer c.Close()
		}
		switch {
		case !tt.OK && (err == nil || !errors.Is(err, hypervisor.ErrInvalidArgument) || tt.Named && !strings.Contains(err.Error(), "helper_silence_limit")):
			t.Errorf("registry.New(Name, %s) = %v; want refused (naming helper_silence_limit: %v)", config, err, tt.Named)
		case tt.OK && err != nil:
			t.Errorf("registry.New(Name, %s) = %v; want nil", config, err)
		case tt.OK:
			if got := d.(*Driver).helpers.SilenceLimit(); got != tt.Want {
				t.Errorf("registry.New(Name, %s): the helper channel's silence limit = %v; want %v", config, got, tt.Want)
			}
		}
	}
}
