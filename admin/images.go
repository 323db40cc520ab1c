package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// Images is the broker's image store as the operator API uses it: the
// local provider's OCI images (internal/broker adapts package images).
type Images interface {
	// ResolveImages resolves the OCI references among refs, the images
	// of an instance on a provider of kind kind, to digests, which the
	// store keeps until its next refresh; names that are no OCI reference
	// ("host"), and every image of a provider that does not run the
	// store's images (a vendor pulls its own), are skipped.
	// ErrImageNotFound marks a reference no registry knows.
	ResolveImages(ctx context.Context, kind string, refs []string) error
	// Pull makes ref present in the cache, calling progress with human
	// lines (no secrets) as it goes.
	Pull(ctx context.Context, ref string, progress func(string)) (adminapi.Image, error)
	// List lists the cache.
	List() []adminapi.Image
	// Remove removes an image by reference or digest; ErrImageInUse when
	// a live workspace runs on it, ErrImageNotFound when it is not cached.
	Remove(ctx context.Context, refOrDigest string) error
}

// Errors an Images returns for the operator API to answer.
var (
	ErrImageNotFound = errors.New("image not found")
	ErrImageInUse    = errors.New("image in use")
)

// errNoImages answers the image routes of a broker without an image store.
const errNoImages = "this broker has no image store (the local provider runs only its host image here)"

// imageRoutes adds the image cache's routes: warming, listing and
// removing are admin's.
func (s *Server) imageRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	adm := []adminapi.Role{adminapi.RoleAdmin}
	route(http.MethodPost, "/images/pull", "image.pull", s.pullImage, adm)
	route(http.MethodGet, "/images", "image.list", s.listImages, adm)
	route(http.MethodDelete, "/images/:ref", "image.remove", s.removeImage, adm)
}

// resolveImages resolves the OCI references scope allows when the
// operator sets it, so that a tag is pinned to a digest from then on and
// a reference no registry knows is refused now rather than at the first
// acquire.
func (v *service) resolveImages(ctx context.Context, prov *providers.Entry, scope sandgate.Scope) error {
	if v.images == nil {
		return nil
	}
	refs := scope.Images
	if scope.DefaultImage != "" {
		refs = append(refs[:len(refs):len(refs)], scope.DefaultImage)
	}
	err := v.images.ResolveImages(ctx, prov.Kind, refs)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrImageNotFound):
		return invalid(err.Error())
	}
	return &protocol.Error{Code: protocol.UpstreamError, Message: "the image registry could not be reached to resolve the scope's images; retry", Err: err}
}

func (s *Server) pullImage(c echo.Context) error {
	if s.service.images == nil {
		return protocol.E(protocol.NotFound, errNoImages)
	}
	var req adminapi.PullImageRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return invalid("ref is required")
	}
	// A stream of JSON lines: the status is sent before the pull's
	// outcome is known, which the last line carries.
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(ev adminapi.PullEvent) {
		_ = enc.Encode(ev)
		w.Flush()
	}
	img, err := s.service.images.Pull(c.Request().Context(), req.Ref, func(line string) {
		send(adminapi.PullEvent{Progress: line})
	})
	if err != nil {
		code := protocol.UpstreamError
		if errors.Is(err, ErrImageNotFound) {
			code = protocol.NotFound
		}
		s.service.log.Warn("image pull failed", "ref", req.Ref, sandgate.KeyError, err)
		send(adminapi.PullEvent{Error: &protocol.EnvelopeError{Code: code, Message: err.Error(), Retryable: code.Retryable(), Details: map[string]any{}}})
		return nil
	}
	send(adminapi.PullEvent{Image: &img})
	return nil
}

func (s *Server) listImages(c echo.Context) error {
	if s.service.images == nil {
		return protocol.E(protocol.NotFound, errNoImages)
	}
	out := s.service.images.List()
	if out == nil {
		out = []adminapi.Image{}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) removeImage(c echo.Context) error {
	if s.service.images == nil {
		return protocol.E(protocol.NotFound, errNoImages)
	}
	ref, err := url.PathUnescape(c.Param("ref"))
	if err != nil {
		return invalid("malformed image reference")
	}
	switch err := s.service.images.Remove(c.Request().Context(), ref); {
	case errors.Is(err, ErrImageInUse):
		return protocol.E(protocol.Conflict, "a live workspace runs on this image")
	case errors.Is(err, ErrImageNotFound):
		return protocol.E(protocol.NotFound, "no such image in the cache")
	case err != nil:
		return &protocol.Error{Code: protocol.Internal, Message: "the image could not be removed", Err: err}
	}
	return c.NoContent(http.StatusNoContent)
}
