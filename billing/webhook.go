package billing

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// WebhookConfig configures the budget alert webhook: every budget alert
// is also POSTed, signed, to URL so that a reseller can notify its tenant.
// A zero field means the default beside it; URL "" disables the webhook.
type WebhookConfig struct {
	// URL is https, or http to a loopback host (tests); see
	// [ValidateWebhookURL].
	URL string
	// Secret is the HMAC-SHA256 key of Sandgate-Signature. Never logged.
	Secret sandgate.Secret
	// Timeout bounds one delivery attempt; default 10s.
	Timeout time.Duration
	// Backoff is the delay before the first retry, doubled for every
	// retry after it up to MaxBackoff; default 1s.
	Backoff time.Duration
	// MaxBackoff caps the delay between attempts; default 1h.
	MaxBackoff time.Duration
	// MaxAttempts bounds the attempts of one alert; default 20.
	MaxAttempts int
	// MaxAge bounds how long an alert is retried; default 24h.
	MaxAge time.Duration
	// Poll is how often an idle deliverer looks for due alerts; default 1s.
	Poll time.Duration
	// Client sends the POSTs; nil means a client that follows no redirect.
	Client *http.Client
}

func (c WebhookConfig) withDefaults() WebhookConfig {
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Hour
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 20
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return c
}

// ValidateWebhookURL accepts an https URL, or an http URL whose host is
// loopback (for tests): alerts carry an account's spending and must not
// cross a network in the clear.
func ValidateWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("webhook url %q: want an absolute http(s) URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		h := u.Hostname()
		if ip := net.ParseIP(h); h == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("webhook url %q: http only to a loopback host; use https", raw)
	}
	return fmt.Errorf("webhook url %q: want https", raw)
}

// WebhookEvent is the JSON body of a budget alert webhook. ID is the same
// for every delivery of one alert, so that the receiver can dedupe.
type WebhookEvent struct {
	ID          string    `json:"id"`
	AccountID   string    `json:"account_id"`
	Scope       string    `json:"scope"` // a, i:<instance>, g:<agent>, i:<instance>:g:<agent>
	Month       string    `json:"month"` // YYYYMM, UTC
	Percent     int       `json:"percent"`
	CapMicros   int64     `json:"cap_micros"`
	SpentMicros int64     `json:"spent_micros"`
	Currency    string    `json:"currency"`
	At          time.Time `json:"at"`
}

// Webhook headers.
const (
	HeaderSignature = "Sandgate-Signature" // t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
	HeaderEventID   = "Sandgate-Event-Id"
)

// SignWebhook returns the Sandgate-Signature value of body sent at t.
func SignWebhook(secret sandgate.Secret, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// VerifyWebhook checks a Sandgate-Signature header against body, and that
// it was signed within tolerance of now. Receivers may copy it.
func VerifyWebhook(secret sandgate.Secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts, sig string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return errors.New("webhook signature: malformed")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return errors.New("webhook signature: outside the tolerance")
	}
	want := SignWebhook(secret, time.Unix(sec, 0), body)
	if !hmac.Equal([]byte(want), []byte("t="+ts+",v1="+sig)) {
		return errors.New("webhook signature: mismatch")
	}
	return nil
}

// webhookDoneTTL keeps done marks past any month's alerts.
const webhookDoneTTL = 40 * 24 * time.Hour

// delivery is a pending webhook delivery.
type delivery struct {
	Account  string `json:"account"`
	Body     string `json:"body"` // the exact bytes signed and sent
	Attempts int    `json:"attempts"`
	FirstMS  int64  `json:"first_ms"`
}

// enqueueScript adds a delivery unless its id is pending or done. K[1]
// deliveries HASH, K[2] due ZSET, K[3] done mark; A[1] id, A[2] JSON, A[3]
// due (unix ms).
var enqueueScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1`)

// claimScript takes the oldest due delivery and pushes it to A[2] (unix
// ms) while it is attempted. K[1] due ZSET, K[2] deliveries HASH; A[1] now.
var claimScript = redis.NewScript(`
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #r == 0 then return false end
local d = redis.call('HGET', KEYS[2], r[1])
if not d then redis.call('ZREM', KEYS[1], r[1]) return false end
redis.call('ZADD', KEYS[1], ARGV[2], r[1])
return {r[1], d}`)

// finishScript ends a delivery: delivered or given up. K[1] due ZSET,
// K[2] deliveries HASH, K[3] done mark, K[4] dead LIST; A[1] id, A[2] done
// TTL (ms), A[3] "1" if given up.
var finishScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
if ARGV[3] == '1' then
  redis.call('RPUSH', KEYS[4], ARGV[1])
  redis.call('LTRIM', KEYS[4], -1000, -1)
end
return 1`)

// alertEventID is an alert's deterministic event id: one per account,
// scope, month and threshold.
func alertEventID(acct string, a Alert) string {
	h := sha256.Sum256([]byte(acct + "\x00" + a.Scope + "\x00" + a.Month + "\x00" + strconv.Itoa(a.Threshold)))
	return "bga_" + hex.EncodeToString(h[:16])
}

// webhookCurrency is the currency an account's alert webhooks state, read
// once for a flush of n alerts: "" when there is nothing to send, and
// NoCurrency when the settings cannot be read.
func (b *Billing) webhookCurrency(ctx context.Context, acct string, n int) string {
	if b.cfg.Webhook.URL == "" || n == 0 {
		return ""
	}
	if s, err := b.Settings(ctx, acct); err == nil {
		return s.Currency
	}
	return NoCurrency
}

// enqueueWebhook queues a budget alert's webhook delivery in currency cur,
// once per event id. A no-op when no webhook is configured.
func (b *Billing) enqueueWebhook(ctx context.Context, acct, cur string, a Alert) error {
	if b.cfg.Webhook.URL == "" {
		return nil
	}
	ev := WebhookEvent{ID: alertEventID(acct, a), AccountID: acct, Scope: a.Scope, Month: a.Month, Percent: a.Threshold,
		CapMicros: a.LimitMicros, SpentMicros: a.UsedMicros, Currency: cur, At: time.UnixMilli(a.AtMS).UTC()}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	now := time.Now()
	d, _ := json.Marshal(delivery{Account: acct, Body: string(body), FirstMS: now.UnixMilli()})
	return enqueueScript.Run(ctx, b.rdb, []string{webhookDeliveriesKey(), webhookDueKey(), webhookDoneKey(ev.ID)},
		ev.ID, d, now.UnixMilli()).Err()
}

// RunWebhooks delivers queued budget alert webhooks until ctx ends. Every
// broker process may run it: each delivery is claimed by one process at a
// time, and a claim lapses (so another process retries) if its holder
// dies mid-attempt. A no-op when no webhook is configured.
func (b *Billing) RunWebhooks(ctx context.Context) {
	if b.cfg.Webhook.URL == "" {
		return
	}
	for ctx.Err() == nil {
		ok, err := b.deliverOne(ctx)
		if err != nil && ctx.Err() == nil {
			b.log.Warn("budget webhook: queue", slog.Any("err", err))
		}
		if ok && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(b.cfg.Webhook.Poll):
		}
	}
}

// deliverOne attempts the oldest due delivery; false if none was due.
func (b *Billing) deliverOne(ctx context.Context) (bool, error) {
	cfg := b.cfg.Webhook
	now := time.Now()
	lease := now.Add(cfg.Timeout + 5*time.Second)
	r, err := claimScript.Run(ctx, b.rdb, []string{webhookDueKey(), webhookDeliveriesKey()}, now.UnixMilli(), lease.UnixMilli()).Slice()
	if isNil(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	id, _ := r[0].(string)
	raw, _ := r[1].(string)
	var d delivery
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		return true, b.finishWebhook(ctx, id, true)
	}
	d.Attempts++
	status, perr := b.post(ctx, id, []byte(d.Body))
	log := b.log.With(slog.String(sandgate.KeyAccountID, d.Account), slog.String("event_id", id), slog.Int("attempt", d.Attempts))
	if perr == nil && status >= 200 && status < 300 {
		log.Info("budget webhook delivered", slog.Int("status", status))
		return true, b.finishWebhook(ctx, id, false)
	}
	if ctx.Err() != nil {
		// Shutting down: the claim lapses and another process retries.
		return true, nil
	}
	delay := cfg.Backoff << min(d.Attempts-1, 30)
	if delay <= 0 || delay > cfg.MaxBackoff {
		delay = cfg.MaxBackoff
	}
	next := time.Now().Add(delay)
	if d.Attempts >= cfg.MaxAttempts || next.Sub(time.UnixMilli(d.FirstMS)) > cfg.MaxAge {
		log.Error("budget webhook: giving up", slog.Int("status", status), slog.Any("err", perr))
		return true, b.finishWebhook(ctx, id, true)
	}
	log.Warn("budget webhook: attempt failed; retrying", slog.Int("status", status), slog.Any("err", perr), slog.Duration("retry_in", delay))
	nd, _ := json.Marshal(d)
	_, err = b.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, webhookDeliveriesKey(), id, nd)
		p.ZAdd(ctx, webhookDueKey(), redis.Z{Score: float64(next.UnixMilli()), Member: id})
		return nil
	})
	return true, err
}

func (b *Billing) finishWebhook(ctx context.Context, id string, gaveUp bool) error {
	return finishScript.Run(ctx, b.rdb, []string{webhookDueKey(), webhookDeliveriesKey(), webhookDoneKey(id), webhookDeadKey()},
		id, webhookDoneTTL.Milliseconds(), boolField(gaveUp)).Err()
}

// post sends one attempt and returns the response's status.
func (b *Billing) post(ctx context.Context, id string, body []byte) (int, error) {
	cfg := b.cfg.Webhook
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sandgate-webhook/1")
	req.Header.Set(HeaderEventID, id)
	req.Header.Set(HeaderSignature, SignWebhook(cfg.Secret, time.Now(), body))
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}
