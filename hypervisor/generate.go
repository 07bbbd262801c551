package hypervisor

// The plugin protocol's Go code is generated from proto/driver.proto with
// protoc and the protoc-gen-go / protoc-gen-go-grpc versions pinned as tools
// in go.mod (the wrapper scripts run them through `go tool`). The output is
// committed; only a change to the .proto needs `go generate ./hypervisor/...`.
//go:generate protoc --plugin=protoc-gen-go=proto/protoc-gen-go.sh --plugin=protoc-gen-go-grpc=proto/protoc-gen-go-grpc.sh --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative proto/driver.proto
