package control

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// commandLog is the log of the command cmd. serve is a daemon: it logs
// what it does, as lines an init system's journal keeps (-v: with the
// debug lines). Every other command is a person's: it prints its result
// on standard output and why it failed on standard error, and the Client's
// log of how it went (a node revoked, the roster published) would only
// bury that; -v shows it, as log lines. Without -v only an error the
// Client logs and carries on from is said, as a sentence (sentences).
func commandLog(cmd string, stderr io.Writer, verbose bool) *slog.Logger {
	switch {
	case verbose:
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	case cmd == "serve":
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(&sentences{w: stderr, prefix: "mesh-control " + cmd + ": ", mu: new(sync.Mutex)})
}

// sentences is a slog.Handler that says records at Error and above as a
// person reads a command's complaint — "mesh-control assign: the node's
// answer was not taken in (node web1, seq 3, err …)" — with no time or
// level key, and drops the rest.
type sentences struct {
	w      io.Writer
	prefix string
	mu     *sync.Mutex // one line at a time, shared by the handlers WithAttrs makes
	attrs  []slog.Attr
}

func (h *sentences) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }

func (h *sentences) Handle(_ context.Context, r slog.Record) error {
	var kv []string
	add := func(a slog.Attr) bool {
		if !a.Equal(slog.Attr{}) {
			kv = append(kv, a.Key+" "+a.Value.Resolve().String())
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	line := h.prefix + r.Message
	if len(kv) > 0 {
		line += " (" + strings.Join(kv, ", ") + ")"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintln(h.w, line)
	return err
}

func (h *sentences) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

// WithGroup flattens: a sentence names its values by their own keys.
func (h *sentences) WithGroup(string) slog.Handler { return h }
