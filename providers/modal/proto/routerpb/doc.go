// Package routerpb is the Go code protoc generates from
// ../modal_proto/task_command_router.proto: the part of Modal's task
// command router (modal.task_command_router.TaskCommandRouter) the Modal
// provider uses.
package routerpb
