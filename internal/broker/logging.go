package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/telemetry"
)

// NewLogger returns the process's logger on stderr: format "json" (the
// default) or "text", at level. A duration attribute is written in
// milliseconds with the unit in its key: "duration" becomes
// "duration_ms": 12.5. Info lines (the access log) are coalesced into few
// writes, each at most telemetry.LogLinger late; warnings and errors are
// written at once. The caller calls the returned func before the process
// exits, which writes what is held.
func NewLogger(level, format string) (*slog.Logger, func(), error) {
	log, lw, err := telemetry.NewBufferedLogger(os.Stderr, level, format)
	if err != nil {
		return nil, nil, err
	}
	return log, func() { _ = lw.Close() }, nil
}

// newLoggerTo is NewLogger's logger writing to w unbuffered.
func newLoggerTo(w io.Writer, level, format string) (*slog.Logger, error) {
	return telemetry.NewLogger(w, level, format)
}

// redisLogger routes go-redis's own log lines (pool and reconnect
// messages) into the process's structured log, instead of plain text on
// stderr.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	r.log.WarnContext(ctx, "redis client", slog.String("detail", msg))
}

// RouteRedisLogs makes go-redis log through log. go-redis has one logger
// per process.
func RouteRedisLogs(log *slog.Logger) {
	redis.SetLogger(redisLogger{log: log.With("component", "redis")})
}
