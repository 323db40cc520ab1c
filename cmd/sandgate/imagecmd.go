package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// imageCommand is `sandgate admin image pull|list|rm`: the broker's cache
// of OCI images for the local provider (admin token).
func imageCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Warm, list and remove the local provider's cached OCI images (admin)",
		Example: "  sandgate admin image pull docker.io/library/python:3.12-slim\n  sandgate admin image list -o json"}
	pull := &cobra.Command{
		Use:     "pull REF",
		Short:   "Pull an image into the broker's cache, showing its progress; prints its digest",
		Example: `  sandgate admin image pull docker.io/library/python:3.12-slim`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			img, err := c.PullImage(cmd.Context(), args[0], func(line string) {
				fmt.Fprintln(cmd.ErrOrStderr(), line)
			})
			if err != nil {
				return err
			}
			return emit(cmd, img, img.Digest)
		},
	}
	list := &cobra.Command{
		Use: "list", Short: "List the cached images, most recently used first",
		Example: "  sandgate admin image list\n  sandgate admin image list -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, f, http.MethodGet, "/images", nil, rowsOf([]string{"REF", "DIGEST", "SIZE", "IN USE", "LAST USED"},
				func(i adminapi.Image) []string {
					return []string{i.Ref, i.Digest, strconv.FormatInt(i.Size, 10), strconv.Itoa(i.InUse), i.LastUsed.Format(time.RFC3339)}
				}))
		},
	}
	rm := &cobra.Command{
		Use: "rm REF|DIGEST", Short: "Remove an image no live workspace runs on from the cache",
		Example: "  sandgate admin image rm docker.io/library/python:3.12-slim",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.do(cmd, http.MethodDelete, "/images/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			return emit(cmd, struct {
				Removed string `json:"removed"`
			}{args[0]}, "removed "+args[0])
		},
	}
	cmd.AddCommand(pull, list, rm)
	return cmd
}
