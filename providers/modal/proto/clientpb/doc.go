// Package clientpb is the Go code protoc generates from
// ../modal_proto/api.proto: the part of Modal's control plane
// (modal.client.ModalClient) the Modal provider uses.
package clientpb
