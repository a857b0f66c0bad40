package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// The control side's two HTTP listeners, the status page and /metrics,
// are served by one rule: a slow or idle client holds nothing for long,
// and many hold at most httpMaxConns connections. With only a header
// timeout, keep-alive connections a client opened and left were never
// closed (600 of 600 open after 16 s): a few such clients would hold the
// process's descriptors for ever.
var (
	httpIdle     = 30 * time.Second // an idle keep-alive connection is closed
	httpMaxConns = 64               // connections at once; more wait to be accepted
)

const (
	httpReadHeader = 10 * time.Second
	// httpRead bounds a whole request: the two servers take GETs.
	httpRead = 30 * time.Second
	// httpWrite bounds an answer: the status page of a large fleet reads
	// the whole registry first.
	httpWrite = 2 * time.Minute
)

// serveHTTP serves h on ln, by the rule above, until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeader, ReadTimeout: httpRead, WriteTimeout: httpWrite,
		IdleTimeout: httpIdle, MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		<-ctx.Done()
		hs.Close()
	}()
	if err := hs.Serve(netutil.LimitListener(ln, httpMaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
