package adminapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// Image is one image in the broker's image cache (GET /images).
type Image struct {
	Ref      string    `json:"ref"`
	Digest   string    `json:"digest"`
	Size     int64     `json:"size_bytes"` // unpacked
	LastUsed time.Time `json:"last_used"`
	InUse    int       `json:"in_use"` // live workspaces on it
}

// PullImageRequest is the body of POST /images/pull.
type PullImageRequest struct {
	Ref string `json:"ref"`
}

// PullEvent is one line of POST /images/pull's answer, a stream of JSON
// lines: progress lines while the pull runs, then exactly one of Image
// (pulled) or Error (failed; the pull's status is already 200).
type PullEvent struct {
	Progress string                  `json:"progress,omitempty"`
	Image    *Image                  `json:"image,omitempty"`
	Error    *protocol.EnvelopeError `json:"error,omitempty"`
}

// PullImage pulls ref into the broker's cache, calling progress (when not
// nil) with each progress line as it arrives.
func (c *Client) PullImage(ctx context.Context, ref string, progress func(string)) (Image, error) {
	resp, err := c.send(ctx, http.MethodPost, "/images/pull", PullImageRequest{Ref: ref})
	if err != nil {
		return Image{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev PullEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return Image{}, fmt.Errorf("operator API: decode answer: %w", err)
		}
		switch {
		case ev.Error != nil:
			return Image{}, &APIError{Status: resp.StatusCode, Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Image != nil:
			return *ev.Image, nil
		case ev.Progress != "" && progress != nil:
			progress(ev.Progress)
		}
	}
	if err := sc.Err(); err != nil {
		return Image{}, fmt.Errorf("operator API: read answer: %w", err)
	}
	return Image{}, errors.New("operator API: the pull's answer ended without its outcome")
}

// ListImages lists the broker's image cache.
func (c *Client) ListImages(ctx context.Context) ([]Image, error) {
	var out []Image
	err := c.Do(ctx, http.MethodGet, "/images", nil, &out)
	return out, err
}

// RemoveImage removes an image (by reference or digest) from the cache;
// an image a live workspace runs on is refused (409 conflict).
func (c *Client) RemoveImage(ctx context.Context, refOrDigest string) error {
	return c.Do(ctx, http.MethodDelete, "/images/"+url.PathEscape(refOrDigest), nil, nil)
}
