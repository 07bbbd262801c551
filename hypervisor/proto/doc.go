// Package proto is the generated gRPC code of vmgate's driver plugin
// protocol (driver.proto). Only package hypervisor's client.go and server.go
// use it; regenerate with `go generate ./hypervisor/...`.
package proto
