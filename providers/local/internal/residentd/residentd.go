// Package residentd is a local workspace's resident (see the local
// provider's README, "The resident"): one process in the workspace's
// sandbox, the broker's own binary run again with
//
//	--sandgate-exec-resident SOCKET
//
// that forks each exec the broker sends it over a private channel. Its
// init recognises that argument and runs the resident before the
// packages that only the broker uses are initialised, so that a resident
// starts in about a millisecond of Go rather than after the whole
// broker's initialisation. The linker runs package inits in dependency
// order and, among those ready, in the order of their import paths: a
// package that needs strings, encoding/json, path/filepath or
// golang.org/x/sys waits behind the 70 to 150 of the broker's packages
// whose paths sort before those. So this package imports only what the
// broker's first initialisations include anyway (errors, os, runtime,
// sync, syscall, unsafe; TestImportsStartEarly): its messages are not
// JSON (wire.go), its system calls are package syscall's (sys_linux.go),
// and a few string helpers are its own. The broker's side is in package
// local.
package residentd

// Name is the resident's argument, after "--".
const Name = "sandgate-exec-resident"

// MaxFDs bounds the descriptors of one request: the connection, stdio, at
// most four cgroup files to join and four to leave.
const MaxFDs = 12

// DefaultPath is a command's PATH when its env has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Exit codes of the resident itself, as the local provider's exec step's.
const (
	exitUsage = 120 // malformed arguments or no control socket: a bug
	exitStart = 122 // it could not set itself up
)

// Request is one exec, as the broker sends it to the resident (Append,
// ParseRequest).
type Request struct {
	Argv []string
	Env  []string
	Dir  string
	// Stdin is whether a stdin pipe follows the connection (else the
	// command's stdin is /dev/null); Join is how many cgroup files
	// follow stdout and stderr.
	Stdin bool
	Join  int
	// Leave is how many cgroup files follow those, which the forking
	// thread moves to once the command is forked, so that killing the
	// leaf never finds a thread of the resident in it: the resident's
	// own cgroups, one in each hierarchy Join's are in, when Home (the
	// thread may then fork the next exec), else the workspace's own
	// cgroups above the leaves (the thread then ends).
	Leave int
	Home  bool
	// Data is the command's RLIMIT_DATA, soft and hard, in bytes (0:
	// the resident's own). The resident runs without it: a Go runtime
	// under a tenant's limit dies of it (a -race build maps most of
	// 512 MiB) and takes every exec in flight with it.
	Data uint64
}

// Reply is how the exec ended (Append, ParseReply).
type Reply struct {
	Status int    // the command's wait status
	Err    string // why it could not be started
	Chdir  bool   // Err is about its directory
	Cgroup bool   // its cgroups could not be joined
}
