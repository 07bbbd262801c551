package qemu

import (
	"context"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/plugins/internal/helperchan/chantest"
)

// TestHelperSilenceLimitSetting: helper_silence_limit reaches the helper
// channel's connections (30 s when unset); one out of bounds is refused,
// naming the setting, before anything is connected.
func TestHelperSilenceLimitSetting(t *testing.T) {
	chantest.CheckSilenceSetting(t, func(setting string) (func() time.Duration, func(), error) {
		config := `{"lab_dir":"/s/lab"}`
		if setting != "" {
			config = `{"lab_dir":"/s/lab","helper_silence_limit":` + setting + `}`
		}
		d, err := registry.New(context.Background(), Name, []byte(config))
		if err != nil {
			return nil, nil, err
		}
		drv := d.(*Driver)
		return drv.helpers.SilenceLimit, func() { drv.Close() }, nil
	})
}
