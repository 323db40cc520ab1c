package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
)

// An operator debugging a tenant's workspace runs a command in it, reads
// a file and writes one: role admin only, each audited as the operator's
// action on the workspace (never its argv, path or contents). They run
// through the saga as the tenant's own calls do, under the scope of the
// workspace's instance (timeouts, output and file caps), and count
// against the exec rate limit of a bucket of their own per operator.

// workspaceIORoutes adds the exec and file routes; New calls it with its
// route helper.
func (s *Server) workspaceIORoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	adm := []adminapi.Role{adminapi.RoleAdmin}
	route(http.MethodPost, "/workspaces/:id/exec", "workspace.exec", s.execWorkspace, adm)
	route(http.MethodPost, "/workspaces/:id/files/read", "workspace.files.read", s.readWorkspaceFile, adm)
	route(http.MethodPost, "/workspaces/:id/files/write", "workspace.files.write", s.writeWorkspaceFile, adm)
}

// operatorLease is the lease an operator's call on w runs under: w's
// instance, and a rate bucket named after the operator, never a tenant's.
func operatorLease(w sandgate.Workspace, actor string) sandgate.Lease {
	return sandgate.Lease{ID: "operator:" + actor, AccountID: w.AccountID, InstanceID: w.InstanceID}
}

// usableWorkspace returns the workspace id, which must take commands now
// (409 while starting, 410 once ended), with the lease the operator's
// call runs under and the limits of its instance's scope.
func (v *service) usableWorkspace(ctx context.Context, id, actor string) (sandgate.Workspace, sandgate.Lease, sandgate.Limits, error) {
	if v.saga == nil {
		return sandgate.Workspace{}, sandgate.Lease{}, sandgate.Limits{}, protocol.E(protocol.Unavailable, "this broker runs no saga: operator exec and files are off")
	}
	found, err := v.workspace(ctx, id)
	if err != nil {
		return found, sandgate.Lease{}, sandgate.Limits{}, err
	}
	l := operatorLease(found, actor)
	w, err := v.saga.Usable(ctx, l, id, "")
	if err != nil {
		return w, l, sandgate.Limits{}, err
	}
	in, err := v.instanceByID(ctx, w.InstanceID)
	if err != nil {
		return w, l, sandgate.Limits{}, err
	}
	scope, _, err := v.saga.Scope(in)
	if err != nil {
		return w, l, sandgate.Limits{}, protocol.E(protocol.Unavailable, "the workspace's provider is not configured on this broker")
	}
	return w, l, scope.Limits, nil
}

// execWorkspace is POST /workspaces/{id}/exec: the protocol's exec, by
// an operator. The answer is the protocol's ExecResponse.
func (s *Server) execWorkspace(c echo.Context) error {
	var req adminapi.ExecRequest
	if err := decodeValid(c, &req, func() error {
		if err := policy.ValidateArgv(req.Argv); err != nil || req.Dir == "" {
			return err
		}
		return policy.ValidatePathField("dir", req.Dir)
	}); err != nil {
		return err
	}
	ctx := c.Request().Context()
	w, l, lim, stdin, err := s.usableWithBytes(c, "stdin_b64", req.StdinB64)
	if err != nil {
		return err
	}
	timeout, clamped, err := policy.ClampExecTimeout(policy.Seconds(req.TimeoutSeconds), lim.DefaultExecTimeout, lim.MaxExecTimeout, math.MaxInt64)
	if err != nil {
		return err
	}
	var stdout, stderr bytes.Buffer
	spec := saga.ExecSpec{Argv: req.Argv, Dir: req.Dir, Stdin: stdin, Timeout: timeout, MaxOutputBytes: lim.MaxOutputBytes,
		Stdout: &stdout, Stderr: &stderr}
	var out adminapi.ExecResponse
	err = s.saga.Exec(ctx, l, lim, w.ID, spec, clamped, func(res saga.ExecResult, clamped bool) {
		o, e := stdout.Bytes(), stderr.Bytes()
		if res.Stdout != nil || res.Stderr != nil { // a provider that kept the output itself
			o, e = res.Stdout, res.Stderr
		}
		out = adminapi.ExecResponse{ExitCode: res.ExitCode, StdoutB64: base64.StdEncoding.EncodeToString(o),
			StderrB64: base64.StdEncoding.EncodeToString(e), StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
			TimeoutClamped: clamped, TimedOut: res.TimedOut, StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes}
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// readWorkspaceFile is POST /workspaces/{id}/files/read: the protocol's
// file read, by an operator, at most the instance's max_file_bytes.
func (s *Server) readWorkspaceFile(c echo.Context) error {
	var req adminapi.ReadFileRequest
	if err := decodeValid(c, &req, func() error { return policy.ValidatePath(req.Path) }); err != nil {
		return err
	}
	ctx := c.Request().Context()
	w, _, lim, err := s.usableWorkspace(ctx, c.Param("id"), operator(c).Actor())
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	n, err := s.saga.ReadFile(ctx, w, req.Path, lim.MaxFileBytes, &buf)
	if err != nil {
		return err
	}
	if n != int64(buf.Len()) {
		return saga.ProviderError(fmt.Errorf("admin: read: the provider counted %d bytes and wrote %d", n, buf.Len()))
	}
	return c.JSON(http.StatusOK, adminapi.ReadFileResponse{ContentsB64: base64.StdEncoding.EncodeToString(buf.Bytes()), SizeBytes: n})
}

// writeWorkspaceFile is POST /workspaces/{id}/files/write: the protocol's
// file write, by an operator. The operator API's body bound (1 MiB, so
// about 750 KiB of contents) applies before the instance's max_file_bytes.
func (s *Server) writeWorkspaceFile(c echo.Context) error {
	var req adminapi.WriteFileRequest
	if err := decodeValid(c, &req, func() error { return policy.ValidatePath(req.Path) }); err != nil {
		return err
	}
	w, _, _, contents, err := s.usableWithBytes(c, "contents_b64", req.ContentsB64)
	if err != nil {
		return err
	}
	if err := s.saga.WriteFile(c.Request().Context(), w, req.Path, bytes.NewReader(contents), func() error { return nil }); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// decodeValid decodes the request's body into req, then checks it with valid.
func decodeValid(c echo.Context, req any, valid func() error) error {
	if err := decodeStrict(c, req); err != nil {
		return err
	}
	return valid()
}

// usableWithBytes decodes the request's field, standard padded base64
// b64, and returns it with the usable workspace of the route's :id (as
// usableWorkspace): bytes over the instance's max_file_bytes are refused.
func (s *Server) usableWithBytes(c echo.Context, field, b64 string) (sandgate.Workspace, sandgate.Lease, sandgate.Limits, []byte, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return sandgate.Workspace{}, sandgate.Lease{}, sandgate.Limits{}, nil, invalid(field + " is not standard base64 with padding")
	}
	w, l, lim, err := s.usableWorkspace(c.Request().Context(), c.Param("id"), operator(c).Actor())
	if err == nil && int64(len(b)) > lim.MaxFileBytes {
		err = protocol.E(protocol.PayloadTooLarge, field+" is over the instance's max_file_bytes")
	}
	return w, l, lim, b, err
}
