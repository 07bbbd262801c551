package main

import (
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/server"
)

// httpOptions turns the config's http section into the server's options
// (zero values take the server's defaults).
func httpOptions(h config.HTTP) server.HTTPOptions {
	return server.HTTPOptions{
		AllowedOrigins:    h.AllowedOrigins,
		AllowedHosts:      h.AllowedHosts,
		RequestsPerMinute: h.RequestsPerMinute,
		BodyTimeout:       time.Duration(h.BodyTimeoutS) * time.Second,
		Sessions: server.HTTPSessionLimits{
			MaxPerGrant: h.Sessions.MaxPerGrant,
			MaxTotal:    h.Sessions.MaxTotal,
			Idle:        time.Duration(h.Sessions.IdleMinutes) * time.Minute,
		},
	}
}
