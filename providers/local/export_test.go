package local

// SeccompFilter bridges the seccomp program to the tests.
var SeccompFilter = seccompFilter
