// Package proto holds the .proto files of the part of Modal's gRPC API the
// Modal provider uses, and regenerates their Go code in clientpb and
// routerpb (see README.md for the pinned generator versions).
package proto

//go:generate protoc -I . --go_out=../../.. --go_opt=module=github.com/sandgate/sandgate --go-grpc_out=../../.. --go-grpc_opt=module=github.com/sandgate/sandgate modal_proto/api.proto modal_proto/task_command_router.proto
