package gateway

import (
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
)

// tenantOf is whom a request of workspace w is counted against.
func tenantOf(w sandgate.Workspace) tenant {
	return tenant{ws: w.ID, inst: w.InstanceID, acct: w.AccountID}
}

func (s *Server) readFile(c echo.Context) error {
	w, err := s.usable(c, admission.ClassExec)
	if err != nil {
		return err
	}
	lim := limitsOf(c)
	// The body (a path), and the contents: at most max_file_bytes, and
	// one byte more that a read keeps to tell a file that grew.
	release, err := s.inflight.acquire(tenantOf(w), bodyCost(c)+lim.MaxFileBytes+1)
	if err != nil {
		dropUnreadBody(c)
		return err
	}
	defer release()
	var req protocol.ReadFileRequest
	read := s.bodyDeadline(c)
	err = decode(c, &req)
	read()
	if err != nil {
		dropUnreadBody(c) // it may have timed out
		return err
	}
	if err := policy.ValidatePath(req.Path); err != nil {
		return err
	}
	// The provider writes the file into chunks as it reads it; the answer
	// is base64-encoded from them into the connection. The status and
	// length depend on the whole read, so the contents are held once.
	var buf fileBuf
	n, err := s.saga.ReadFile(c.Request().Context(), w, req.Path, lim.MaxFileBytes, &buf)
	if err != nil {
		return err
	}
	if n != buf.n {
		return saga.ProviderError(fmt.Errorf("gateway: read: the provider counted %d bytes and wrote %d", n, buf.n))
	}
	// protocol.ReadFileResponse, encoded straight into the response.
	return b64JSON{
		text: []string{`{"contents_b64":"`, `","size_bytes":` + jsonInt(n) + `}`},
		b64:  [][][]byte{buf.chunks},
	}.write(c, http.StatusOK)
}

// writeFile streams contents_b64 from the body into the provider: the
// path must come first for that (as every client sends it); when the
// contents come first, the gateway holds them decoded until the path is
// read, reserving them once more.
func (s *Server) writeFile(c echo.Context) error {
	w, err := s.usable(c, admission.ClassExec)
	if err != nil {
		return err
	}
	lim := limitsOf(c)
	req := c.Request()
	release, err := s.inflight.acquire(tenantOf(w), writeCost(req.ContentLength, lim.MaxFileBytes))
	if err != nil {
		dropUnreadBody(c)
		return err
	}
	defer release()
	defer s.bodyDeadline(c)() // the body streams into the provider until WriteFile returns
	body := newWriteBody(req.Body, req.ContentLength, lim.MaxFileBytes)
	stream := body.head()
	if body.err != nil {
		return body.err
	}
	var contents io.Reader = body
	if !stream {
		// Scanned whole: the contents are held (or empty).
		contents = &fileBuf{}
		if body.held != nil {
			more, err := s.inflight.acquireBytes(tenantOf(w), body.held.n)
			if err != nil {
				return err
			}
			defer more()
			contents = body.held
		}
	}
	if err := s.saga.WriteFile(req.Context(), w, body.path, contents, body.finish); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
