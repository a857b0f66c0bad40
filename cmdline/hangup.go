package cmdline

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// KeepOnHangup keeps a daemon running through what would end it without
// a word: SIGHUP (the terminal it was started from closed; a person
// expecting a reload), said in its log and otherwise ignored, since none
// of these daemons reloads anything; and SIGPIPE, which the Go runtime
// turns into the process's death when a write to standard output or error
// finds its reader gone (journald restarted, `serve 2>&1 | head`): the
// write fails instead, and the daemon goes on, its log lost until it is
// read again. For daemons only: a command's output piped to head should
// end the command.
func KeepOnHangup(log *slog.Logger) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGHUP {
				log.Info("SIGHUP: ignored (this daemon reloads nothing; SIGTERM stops it)")
			}
		}
	}()
}
