package stripesync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v82"

	"github.com/sandgate/sandgate"
)

// event is one meter event, ready to send.
type event struct {
	identifier string
	eventName  string
	customer   string
	value      int64
	timestamp  time.Time
}

// Identifier is the meter event identifier of the ledger entry entryID of
// acct: "sg_" and 40 hex digits of SHA-256(acct, entryID), 43 characters
// (Stripe allows 100). It depends on nothing else, so every gateway, every
// retry and every restart sends an entry under the same identifier, and
// Stripe counts it once.
func Identifier(acct, entryID string) string {
	sum := sha256.Sum256([]byte(acct + "\x00" + entryID))
	return "sg_" + hex.EncodeToString(sum[:20])
}

// sender sends meter events through stripe-go with its own retries off:
// the Syncer decides what is retried, and when.
type sender struct {
	client  *stripe.Client
	key     sandgate.Secret
	timeout time.Duration
}

func newSender(baseURL string, key sandgate.Secret, hc *http.Client, timeout time.Duration) *sender {
	cfg := &stripe.BackendConfig{
		HTTPClient:        hc,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull}, // its lines could carry request details
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
	}
	if baseURL != "" {
		cfg.URL = stripe.String(strings.TrimRight(baseURL, "/"))
	}
	return &sender{
		client:  stripe.NewClient(key.Reveal(), stripe.WithBackends(stripe.NewBackendsWithConfig(cfg))),
		key:     key,
		timeout: timeout,
	}
}

// send creates one meter event. The identifier is also the request's
// Idempotency-Key, so a resend within Stripe's idempotency window gets the
// first answer back. Its error is a *SendError.
func (s *sender) send(ctx context.Context, ev event) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	p := &stripe.BillingMeterEventCreateParams{
		EventName:  stripe.String(ev.eventName),
		Identifier: stripe.String(ev.identifier),
		Payload: map[string]string{
			"stripe_customer_id": ev.customer,
			"value":              strconv.FormatInt(ev.value, 10),
		},
		Timestamp: stripe.Int64(ev.timestamp.Unix()),
	}
	p.SetIdempotencyKey(ev.identifier)
	_, err := s.client.V1BillingMeterEvents.Create(ctx, p)
	if err == nil {
		return nil
	}
	return s.classify(ctx, err)
}

// SendError is a failed send to Stripe. Its text never holds the secret
// key: Stripe's message is kept with the key (and anything that looks like
// a Stripe key) cut out.
type SendError struct {
	Status     int           // the HTTP status; 0 when no answer came (network, timeout)
	Code       string        // Stripe's error code, if any
	Message    string        // Stripe's message or the network error, redacted
	RetryAfter time.Duration // from the Retry-After header, when > 0
	// local is a refusal by this package: the entry cannot be a meter
	// event (a negative value, an entry that does not decode); never sent.
	local bool
}

// notSendable is the error of an entry that cannot be a meter event.
func notSendable(reason string) *SendError { return &SendError{Message: reason, local: true} }

func (e *SendError) Error() string {
	var b strings.Builder
	b.WriteString("stripe meter event: ")
	if e.local {
		b.WriteString("not sent")
	} else if e.Status != 0 {
		b.WriteString(strconv.Itoa(e.Status))
	} else {
		b.WriteString("no response")
	}
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Retryable reports whether a later identical send may succeed: a 429, a
// 5xx, or no answer at all.
func (e *SendError) Retryable() bool {
	return !e.local && (e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500)
}

// accountWide reports whether the failure is the account's or the key's,
// not the entry's (401, 403): such a failure never dead-letters an entry.
func (e *SendError) accountWide() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
}

func (s *sender) classify(ctx context.Context, err error) *SendError {
	var se *stripe.Error
	if errors.As(err, &se) {
		out := &SendError{Status: se.HTTPStatusCode, Code: string(se.Code), Message: s.redact(se.Msg)}
		if se.LastResponse != nil {
			out.RetryAfter = retryAfter(se.LastResponse.Header.Get("Retry-After"))
		}
		return out
	}
	if ctx.Err() != nil {
		return &SendError{Message: "timed out"}
	}
	// A body that was not Stripe's JSON error, or a network failure.
	return &SendError{Message: s.redact(fmt.Sprint(err))}
}

// redact cuts the secret key, and anything shaped like a Stripe secret or
// restricted key, out of msg, and bounds its length.
func (s *sender) redact(msg string) string {
	if k := s.key.Reveal(); k != "" {
		msg = strings.ReplaceAll(msg, k, "REDACTED")
	}
	for _, p := range []string{"sk_live_", "sk_test_", "rk_live_", "rk_test_"} {
		for {
			i := strings.Index(msg, p)
			if i < 0 {
				break
			}
			j := i + len(p)
			for j < len(msg) && isKeyChar(msg[j]) {
				j++
			}
			msg = msg[:i] + "REDACTED" + msg[j:]
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return msg
}

func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '*'
}

// retryAfter parses a Retry-After header: delay seconds (an HTTP date is
// not expected from Stripe and reads as none).
func retryAfter(h string) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, 3600)) * time.Second
}
