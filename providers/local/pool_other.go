//go:build !linux

package local

func renameNoReplace(string, string) error { return errUnsupported }
