package libvirt

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/mux"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// TestHelperSilenceLimitSetting: helper_silence_limit reaches the helper
// channel's connections (30 s when unset); one out of bounds is refused,
// naming the setting, before anything is connected.
func TestHelperSilenceLimitSetting(t *testing.T) {
	tests := []struct {
		setting string // the JSON value; "" leaves it out
		want    time.Duration
		ok      bool
		named   bool // the refusal names the setting (the bounds' check; a value that does not decode is refused by registry.Duration)
	}{
		{"", mux.DefaultSilenceLimit, true, false},
		{`"2s"`, 2 * time.Second, true, false},
		{`"90s"`, 90 * time.Second, true, false},
		{`"1h"`, time.Hour, true, false},
		{`"1s"`, 0, false, true},
		{`"1999ms"`, 0, false, true},
		{`"1h1s"`, 0, false, true},
		{`"0s"`, 0, false, false},
		{`"-5s"`, 0, false, false},
		{`"soon"`, 0, false, false},
		{`30`, 0, false, false},
	}
	for _, tt := range tests {
		config := `{}`
		if tt.setting != "" {
			config = `{"helper_silence_limit":` + tt.setting + `}`
		}
		d, err := registry.New(context.Background(), Name, []byte(config))
		if !tt.ok {
			if err == nil || !errors.Is(err, hypervisor.ErrInvalidArgument) || tt.named && !strings.Contains(err.Error(), "helper_silence_limit") {
				t.Errorf("registry.New(Name, %s) = %v; want refused (naming helper_silence_limit: %v)", config, err, tt.named)
			}
			if c, ok := d.(hypervisor.Closer); ok {
				c.Close()
			}
			continue
		}
		if err != nil {
			t.Errorf("registry.New(Name, %s) = %v; want nil", config, err)
			continue
		}
		drv := d.(*Driver)
		if got := drv.helpers.SilenceLimit(); got != tt.want {
			t.Errorf("registry.New(Name, %s): the helper channel's silence limit = %v; want %v", config, got, tt.want)
		}
		drv.Close()
	}
}
