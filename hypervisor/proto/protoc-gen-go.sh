#!/bin/sh
# Runs the protoc-gen-go pinned as a tool in go.mod (used by go generate).
exec go tool protoc-gen-go "$@"
