// Package guest is the broker's agent inside a vendor guest: the jail every
// tenant process runs in, the keeper that ends the guest at its deadline,
// and the forwarder that carries the jail's egress to the broker's proxy.
package guest
