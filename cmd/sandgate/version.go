package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// Set at link time by the Dockerfile (-ldflags "-X main.buildCommit=…"),
// for builds without VCS stamping (-buildvcs=false, or no .git).
var (
	buildVersion string
	buildCommit  string
)

// buildInfo is what `sandgate version` prints.
type buildInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Go       string `json:"go"`
	Modified bool   `json:"modified"`
}

// readBuildInfo reads the module version, the VCS commit and the Go
// version from the binary's build info, the link-time values filling in
// what it lacks.
func readBuildInfo() buildInfo {
	bi := buildInfo{Version: "(devel)", Commit: "unknown", Go: "unknown"}
	if info, ok := debug.ReadBuildInfo(); ok {
		bi.Go = info.GoVersion
		if v := info.Main.Version; v != "" {
			bi.Version = v
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				bi.Commit = s.Value
			case "vcs.modified":
				bi.Modified = s.Value == "true"
			}
		}
	}
	if buildVersion != "" && bi.Version == "(devel)" {
		bi.Version = buildVersion
	}
	if buildCommit != "" && bi.Commit == "unknown" {
		bi.Commit = buildCommit
	}
	return bi
}

func (b buildInfo) String() string {
	commit := b.Commit
	if b.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("sandgate %s\ncommit %s\n%s\n", b.Version, commit, b.Go)
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi := readBuildInfo()
			return emit(cmd, bi, strings.TrimSuffix(bi.String(), "\n"))
		},
	}
}
