package main

import (
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/server/mcphttp"
)

// httpOptions turns the config's http section into the server's options
// (zero values take the server's defaults).
func httpOptions(h config.HTTP) mcphttp.Options {
	return mcphttp.Options{
		AllowedOrigins:    h.AllowedOrigins,
		AllowedHosts:      h.AllowedHosts,
		RequestsPerMinute: h.RequestsPerMinute,
		BodyTimeout:       time.Duration(h.BodyTimeoutS) * time.Second,
		Sessions: mcphttp.SessionLimits{
			MaxPerGrant: h.Sessions.MaxPerGrant,
			MaxTotal:    h.Sessions.MaxTotal,
			Idle:        time.Duration(h.Sessions.IdleMinutes) * time.Minute,
		},
	}
}
