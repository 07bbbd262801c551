#!/bin/sh
# Runs the protoc-gen-go-grpc pinned as a tool in go.mod (used by go generate).
exec go tool protoc-gen-go-grpc "$@"
