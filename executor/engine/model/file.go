package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The shared file as text, for the tests that hold a machine's file to the
// model's blocks: written by a person with the world's blocks, read back as
// blocks and what lies outside them, and a block edited by hand. A block
// is "# BEGIN mesh NAME", its lines, "# END mesh NAME" (docs/declaration.md,
// region).

// hostLines are the lines of the file's own, before and after the blocks
// a person wrote.
const hostHead, hostTail = "127.0.0.1 localhost\n", "::1 localhost\n"

// FileText is the shared file as a person wrote it, with blocks.
func FileText(blocks map[string]string) string {
	var b strings.Builder
	b.WriteString(hostHead)
	for _, n := range slices.Sorted(maps.Keys(blocks)) {
		fmt.Fprintf(&b, "# BEGIN mesh %s\n%s# END mesh %s\n", n, blocks[n], n)
	}
	b.WriteString(hostTail)
	return b.String()
}

// HostText is what lies outside the blocks, as a person wrote the file.
const HostText = hostHead + hostTail

// FileBlocks reads a shared file's blocks by name, and what lies outside
// them; markers that do not pair up are an error.
func FileBlocks(text string) (map[string]string, string, error) {
	blocks := map[string]string{}
	var out strings.Builder
	open, body := "", ""
	for _, l := range strings.SplitAfter(text, "\n") {
		t := strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(t, "# BEGIN mesh "):
			if open != "" {
				return nil, "", fmt.Errorf("%q inside the block %s", t, open)
			}
			open, body = strings.TrimPrefix(t, "# BEGIN mesh "), ""
		case strings.HasPrefix(t, "# END mesh "):
			if strings.TrimPrefix(t, "# END mesh ") != open {
				return nil, "", fmt.Errorf("%q ends no block begun", t)
			}
			if _, twice := blocks[open]; twice {
				return nil, "", fmt.Errorf("two blocks %s", open)
			}
			blocks[open], open = body, ""
		case open != "":
			body += l
		default:
			out.WriteString(l)
		}
	}
	if open != "" {
		return nil, "", fmt.Errorf("the block %s does not end", open)
	}
	return blocks, out.String(), nil
}

// EditBlock is text with the block name's lines replaced by content, as an
// operator edits it by hand; text as it is when it has no such block.
func EditBlock(text, name, content string) string {
	begin, end := "# BEGIN mesh "+name+"\n", "# END mesh "+name+"\n"
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		return text
	}
	return text[:i+len(begin)] + content + text[j:]
}

// The keys file as text: a person's comment, then a line "Key value" for
// each key (sshd_config's format, docs/declaration.md, keys).

// keysHead is the keys file's line of its own, which no apply touches.
const keysHead = "# a person's sshd_config\n"

// KeysText is the keys file as a person wrote it.
func KeysText(keys map[string]string) string {
	var b strings.Builder
	b.WriteString(keysHead)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		fmt.Fprintf(&b, "%s %s\n", k, keys[k])
	}
	return b.String()
}

// FileKeys reads a keys file's keys; a key twice, or the person's line
// gone, is an error.
func FileKeys(text string) (map[string]string, error) {
	keys := map[string]string{}
	if !strings.HasPrefix(text, keysHead) {
		return nil, fmt.Errorf("the first line is not the person's: %q", text)
	}
	for _, l := range strings.SplitAfter(strings.TrimPrefix(text, keysHead), "\n") {
		if l == "" {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSuffix(l, "\n"), " ")
		if _, twice := keys[k]; twice || !ok || !strings.HasSuffix(l, "\n") {
			return nil, fmt.Errorf("the line %q", l)
		}
		keys[k] = v
	}
	return keys, nil
}

// EditKey is text with key set to value by hand, as an operator does
// (added at the end when absent), or its line taken out (out).
func EditKey(text, key, value string, out bool) string {
	var b strings.Builder
	found := false
	for _, l := range strings.SplitAfter(text, "\n") {
		if k, _, _ := strings.Cut(l, " "); k == key && l != "" {
			found = true
			if !out {
				fmt.Fprintf(&b, "%s %s\n", key, value)
			}
			continue
		}
		b.WriteString(l)
	}
	if !found && !out {
		fmt.Fprintf(&b, "%s %s\n", key, value)
	}
	return b.String()
}
