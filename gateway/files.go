package gateway

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
)

func sandboxOf(w sandgate.Workspace) providers.Sandbox { return providers.Sandbox{Ref: w.ProviderRef} }

// providerOf returns the provider w was created on, whether or not it
// still accepts new work.
func (s *Server) providerOf(w sandgate.Workspace) (providers.Provider, error) {
	return s.saga.ProviderOf(w.Provider)
}

// commandsOf returns the durable commands of w's provider: its own, or the
// generic runner over its Exec.
func (s *Server) commandsOf(w sandgate.Workspace) (providers.Commander, error) {
	p, err := s.providerOf(w)
	if err != nil {
		return nil, err
	}
	return runner.For(p), nil
}

func (s *Server) readFile(c echo.Context) error {
	w, err := s.usable(c, admission.ClassExec)
	if err != nil {
		return err
	}
	lim := limitsOf(c)
	release, err := s.reserveTransfer(c, w, lim.MaxFileBytes)
	if err != nil {
		return err
	}
	defer release()
	var req protocol.ReadFileRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := policy.ValidatePath(req.Path); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if err := s.db.Touch(ctx, w, s.clock.Now()); err != nil {
		return unavailable(err)
	}
	p, err := s.providerOf(w)
	if err != nil {
		return err
	}
	b, err := p.ReadFile(ctx, sandboxOf(w), req.Path, lim.MaxFileBytes)
	if err != nil {
		return providerError(err)
	}
	// protocol.ReadFileResponse, encoded straight into the response.
	return b64JSON{
		text: []string{`{"contents_b64":"`, `","size_bytes":` + jsonInt(int64(len(b))) + `}`},
		b64:  [][][]byte{onepart(b)},
	}.write(c, http.StatusOK)
}

// reserveTransfer reserves a file transfer of w before its body is read:
// the body, and the contents (at most max_file_bytes, and one byte more
// that a read keeps to tell a file that grew).
func (s *Server) reserveTransfer(c echo.Context, w sandgate.Workspace, maxFileBytes int64) (func(), error) {
	return s.inflight.acquire(w.ID, w.InstanceID, bodyCost(c)+maxFileBytes+1)
}

func (s *Server) writeFile(c echo.Context) error {
	w, err := s.usable(c, admission.ClassExec)
	if err != nil {
		return err
	}
	lim := limitsOf(c)
	release, err := s.reserveTransfer(c, w, lim.MaxFileBytes)
	if err != nil {
		return err
	}
	defer release()
	var req protocol.WriteFileRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := policy.ValidatePath(req.Path); err != nil {
		return err
	}
	data, err := decodeB64("contents_b64", req.ContentsB64)
	if err != nil {
		return err
	}
	if int64(len(data)) > lim.MaxFileBytes {
		return protocol.E(protocol.FileTooLarge, "contents are over max_file_bytes")
	}
	ctx := c.Request().Context()
	if err := s.db.Touch(ctx, w, s.clock.Now()); err != nil {
		return unavailable(err)
	}
	p, err := s.providerOf(w)
	if err != nil {
		return err
	}
	if err := p.WriteFile(ctx, sandboxOf(w), req.Path, data); err != nil {
		return providerError(err)
	}
	return c.NoContent(http.StatusNoContent)
}
