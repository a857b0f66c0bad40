package engine

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"
)

// Bounds of a plan's content diffs: the whole file is read only up to
// maxDiffInput, and the diff shown only up to maxDiffLines.
const (
	maxDiffInput = 1 << 20
	maxDiffLines = 200
)

// contentDiff is what `plan` shows of a file whose content would change: a
// unified diff of what is on the machine against what is declared, capped,
// or a word on why there is none (binary, too large). It is for the
// person at the terminal only: a report never carries it, since what is
// on the machine may be a secret the declaration replaces.
func contentDiff(path string, found []byte, exists bool, declared []byte) string {
	return contentDiffFrom(path, " (on the machine)", found, exists, declared)
}

// contentDiffFrom is contentDiff with what the found side is said to be:
// the machine's, or what a removal before it in the same apply leaves.
func contentDiffFrom(path, what string, found []byte, exists bool, declared []byte) string {
	if len(found) > maxDiffInput || len(declared) > maxDiffInput {
		return fmt.Sprintf("(not shown: larger than %d KiB; %d bytes on the machine, %d declared)", maxDiffInput>>10, len(found), len(declared))
	}
	if isBinary(found) || isBinary(declared) {
		return fmt.Sprintf("(binary content: %d bytes on the machine, %d declared)", len(found), len(declared))
	}
	from := path + what
	if !exists {
		from = "/dev/null"
	}
	text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: splitLines(found), B: splitLines(declared),
		FromFile: from, ToFile: path + " (declared)", Context: 3,
	})
	if err != nil {
		return "(not shown: " + err.Error() + ")"
	}
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > maxDiffLines {
		text = strings.Join(lines[:maxDiffLines], "") + fmt.Sprintf("… %d more lines of diff\n", len(lines)-maxDiffLines)
	}
	return text
}

func isBinary(b []byte) bool { return bytes.IndexByte(b, 0) >= 0 || !utf8.Valid(b) }

// splitLines splits b into lines that each end in a newline (difflib's own
// SplitLines adds an empty last line to text that ends in one).
func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	} else {
		lines[len(lines)-1] += "\n"
	}
	return lines
}
