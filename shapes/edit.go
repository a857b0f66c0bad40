package shapes

import (
	"bytes"
	"strings"
)

// The grammar of what the host writes into a shared file (region, keys),
// here because a declaration is validated against it before the executor
// (executor/edit) writes by it: one place for each rule.

// MaxRegionComment bounds a region's comment leader.
const MaxRegionComment = 8

// ParseRegionMarker reads a region's marker line: a comment leader (1 to
// MaxRegionComment bytes, no blank), one space, "BEGIN mesh " or "END
// mesh ", and a name with no blank; trailing spaces, tabs and a CR
// allowed. It says which marker, and the name.
func ParseRegionMarker(text []byte) (begin bool, name string, ok bool) {
	t := bytes.TrimRight(text, " \t\r")
	sp := bytes.IndexByte(t, ' ')
	if sp < 1 || sp > MaxRegionComment || bytes.ContainsAny(t[:sp], "\t") {
		return false, "", false
	}
	rest := t[sp+1:]
	switch {
	case bytes.HasPrefix(rest, []byte("BEGIN mesh ")):
		begin, rest = true, rest[len("BEGIN mesh "):]
	case bytes.HasPrefix(rest, []byte("END mesh ")):
		rest = rest[len("END mesh "):]
	default:
		return false, "", false
	}
	if len(rest) == 0 || bytes.ContainsAny(rest, " \t") {
		return false, "", false
	}
	return begin, string(rest), true
}

// ValidKeyName reports whether a key of a keys resource can be declared:
// letters, digits and ._-/ (sysctl's net.ipv4.ip_forward, sshd's
// PasswordAuthentication, an environment variable), at most 128 bytes.
func ValidKeyName(key string) bool {
	if key == "" || len(key) > 128 {
		return false
	}
	for _, c := range []byte(key) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == '/':
		default:
			return false
		}
	}
	return true
}

// ValidKeyValue reports whether value can be declared for a key: one
// line, no NUL, at most 4096 bytes, no blanks at either end (a file would
// not keep them); in the space format, not empty.
func ValidKeyValue(value string, space bool) bool {
	if len(value) > 4096 || strings.ContainsAny(value, "\n\x00") || strings.Trim(value, " \t\r") != value {
		return false
	}
	return !space || value != ""
}
