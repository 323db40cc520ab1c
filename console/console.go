// Package console is the operator console: server-rendered HTML pages on
// the operator listener (under /console/) for live workspaces and killing
// one, accounts and their balances, usage charts, stops and pauses, and
// the audit log. It holds no state and no power of its own: an operator
// signs in with an operator token, kept in an HttpOnly, Secure,
// SameSite=Strict cookie, and every page reads, and every action changes,
// through the operator API with that token, so the API's roles decide what
// each operator sees and may do and its audit log records every action.
// Every change is a POST that carries a CSRF token bound to the session.
package console

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

//go:embed templates/*.html static/*
var files embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console/"

// cookieName holds the signed-in operator's token.
const cookieName = "sandgate_console"

// sessionLifetime bounds a sign-in.
const sessionLifetime = 8 * time.Hour

// Config configures the console. A zero field means the default noted beside it.
type Config struct {
	// API is the operator API's handler (package admin's Server.Handler). Required.
	API http.Handler
	// Clock gives the default usage month. nil means the system clock.
	Clock sandgate.Clock
	// Log receives failures of the console itself. nil discards them.
	Log *slog.Logger
}

// Console serves the operator console. It is safe for concurrent use.
type Console struct {
	api   http.Handler
	clock sandgate.Clock
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
}

// New returns the console over the operator API.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil {
		return nil, errors.New("console: no operator API")
	}
	if cfg.Clock == nil {
		cfg.Clock = sandgate.SystemClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Console{api: cfg.API, clock: cfg.Clock, log: cfg.Log, pages: map[string]*template.Template{}}
	names, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: %s: %w", n, err)
		}
		c.pages[strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")] = t
	}
	c.routes()
	return c, nil
}

// Handler returns the console's handler; it expects paths under Prefix.
func (c *Console) Handler() http.Handler { return c }

// ServeHTTP sets the headers of every console answer and dispatches it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	// script-src and connect-src: live.js, the console's one script, and
	// the table fragments it fetches; no inline script.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin") // not no-referrer: with it, browsers send "Origin: null" on the console's own forms
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// sameOrigin reports whether a change comes from the console's own pages:
// an Origin header, when the browser sends one, must name this host.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // SameSite=Strict keeps the cookie off cross-site requests; the CSRF token does the rest
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// session is the signed-in operator of one request.
type session struct {
	token sandgate.Secret
	who   adminapi.Whoami
	csrf  string
}

func (s *session) may(roles ...adminapi.Role) bool {
	for _, r := range roles {
		if s.who.Role == r {
			return true
		}
	}
	return false
}

// csrfFor is the CSRF token of the session of tok: an HMAC keyed by the
// operator token itself, so it needs no storage, holds in every broker
// process and across restarts, differs per operator token, and cannot be
// made without the token, which the cookie keeps from the page's scripts
// and other sites.
func csrfFor(tok sandgate.Secret) string {
	m := hmac.New(sha256.New, []byte(tok.Reveal()))
	m.Write([]byte("sandgate console csrf v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// session returns the request's signed-in operator, or nil (and an
// answer already written: a redirect to the sign-in page) when there is
// none or its token is no longer known.
func (c *Console) session(w http.ResponseWriter, r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil || ck.Value == "" {
		http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
		return nil
	}
	tok := sandgate.Secret(ck.Value)
	var who adminapi.Whoami
	if err := c.call(r, tok, http.MethodGet, "/whoami", nil, &who); err != nil {
		var ae *adminapi.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			clearCookie(w)
			http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
			return nil
		}
		c.fail(w, r, nil, err)
		return nil
	}
	return &session{token: tok, who: who, csrf: csrfFor(tok)}
}

// change returns the session of a POST whose CSRF token is right, or nil
// with the refusal written.
func (c *Console) change(w http.ResponseWriter, r *http.Request) *session {
	s := c.session(w, r)
	if s == nil {
		return nil
	}
	if err := r.ParseForm(); err != nil {
		c.render(w, r, s, http.StatusBadRequest, "error", errorPage{Status: 400, Message: "the form could not be read"})
		return nil
	}
	if got := r.PostForm.Get("csrf"); !hmac.Equal([]byte(got), []byte(s.csrf)) {
		c.render(w, r, s, http.StatusForbidden, "error", errorPage{Status: 403, Message: "the form's CSRF token is missing or stale; reload the page and try again"})
		return nil
	}
	return s
}

func setCookie(w http.ResponseWriter, tok string) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: Prefix, MaxAge: int(sessionLifetime / time.Second),
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
}

func clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
}

// apiRequest is a request to the operator API on behalf of r's operator:
// it carries r's peer address, user agent and request id, so the audit
// log names the operator's browser as the source.
func apiRequest(r *http.Request, tok sandgate.Secret, method, path string, in any) (*http.Request, error) {
	req, err := adminapi.NewRequest(r.Context(), method, "/admin/v1"+path, tok, in)
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = r.RemoteAddr
	req.Host = r.Host
	req.Header.Set("User-Agent", strings.TrimSpace("sandgate-console "+r.UserAgent()))
	if id := r.Header.Get(protocol.HeaderRequestID); id != "" {
		req.Header.Set(protocol.HeaderRequestID, id)
	}
	return req, nil
}

// call sends one request to the operator API in process and decodes its
// answer into out (when non-nil). A refusal is an *adminapi.APIError.
func (c *Console) call(r *http.Request, tok sandgate.Secret, method, path string, in, out any) error {
	_, err := c.callHeader(r, tok, method, path, in, out)
	return err
}

// callHeader is call that also returns the answer's header (a list's
// next cursor).
func (c *Console) callHeader(r *http.Request, tok sandgate.Secret, method, path string, in, out any) (http.Header, error) {
	req, err := apiRequest(r, tok, method, path, in)
	if err != nil {
		return nil, err
	}
	if method == http.MethodGet {
		req = req.WithContext(adminapi.WithConsoleRead(req.Context())) // a page view, not an audited action
	}
	rec := &recorder{header: http.Header{}}
	c.api.ServeHTTP(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.status >= 300 {
		return rec.header, adminapi.ParseError(rec.status, rec.body.Bytes())
	}
	if out == nil {
		return rec.header, nil
	}
	if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
		return rec.header, fmt.Errorf("console: decode %s %s: %w", method, path, err)
	}
	return rec.header, nil
}

// streamLines sends a GET to the operator API and hands each line of a
// successful answer to fn as it is written (the audit export's JSON
// lines), so memory stays bounded whatever the answer's length.
func (c *Console) streamLines(r *http.Request, tok sandgate.Secret, path string, fn func([]byte)) error {
	req, err := apiRequest(r, tok, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	req = req.WithContext(adminapi.WithConsoleRead(req.Context())) // the audit page's view of the log
	lw := &lineWriter{recorder: recorder{header: http.Header{}}, fn: fn}
	c.api.ServeHTTP(lw, req)
	if lw.status >= 300 {
		var env protocol.Envelope
		_ = json.Unmarshal(lw.body.Bytes(), &env)
		return &adminapi.APIError{Status: lw.status, Code: env.Error.Code, Message: env.Error.Message}
	}
	if rest := bytes.TrimSpace(lw.body.Bytes()); len(rest) > 0 {
		fn(rest)
	}
	return nil
}

// lineWriter is a recorder that, once the status is a success, passes
// each complete line to fn instead of keeping it.
type lineWriter struct {
	recorder
	fn func([]byte)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n, err := w.recorder.Write(p)
	if w.status >= 300 {
		return n, err
	}
	for {
		b := w.body.Bytes()
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		w.fn(b[:i])
		w.body.Next(i + 1)
	}
	return n, err
}

// recorder is the http.ResponseWriter of an in-process API call.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// Flush is a no-op: the whole answer is read once the call returns.
func (r *recorder) Flush() {}

// Interface guards
var (
	_ http.Flusher = (*recorder)(nil)
	_ http.Flusher = (*lineWriter)(nil)
	_ http.Handler = (*Console)(nil)
)
