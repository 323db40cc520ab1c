package local

// The egress forwarder (package forward): inside a sandbox whose
// workspace has domains to reach, the command runs below the broker's own
// binary, bound read-only at forwardBin:
//
//	/run/sandgate/forward --sandgate-egress-forward SOCKET ADDR -- ARGV…
//
// with SOCKET the workspace's proxy socket bound into the sandbox
// (egressSock) and ADDR forwardAddr. These are where the forwarder and
// the workspace's proxy socket are in the sandbox.
const (
	forwardBin  = "/run/sandgate/forward"
	egressMount = "/run/sandgate/egress" // the workspace's egress/ directory
	egressSock  = egressMount + "/" + egressSockName
	// forwardAddr is the proxy's address in the sandbox, which
	// HTTP_PROXY and the others name.
	forwardAddr = "127.0.0.1:3128"
)
