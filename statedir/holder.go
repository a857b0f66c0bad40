package statedir

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FlockHolder is the pid holding a flock on fd's file, as the kernel lists
// it in /proc/locks ("1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF", the
// device as hexadecimal major:minor, the inode in decimal); 0 when it
// cannot tell (no /proc, or the holder let go meanwhile). Read, not
// tried: a lock taken to see would refuse the holder starting then (the
// executor's store, whose lock is its directory itself and has no pid
// file; the launcher's lock, asked by status whether one runs).
func FlockHolder(fd int) int {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		// A blocked waiter's line starts "1: ->": skip it.
		if len(f) < 6 || f[1] != "FLOCK" || f[3] != "WRITE" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid != os.Getpid() {
			return pid
		}
	}
	return 0
}
