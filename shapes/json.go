package shapes

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// The rescue command is one short process, and encoding/json builds its
// reflection tables for each type the first time it meets it: for the
// report and the store's records that cost more than the rest of a
// one-file apply's own work. What is written on every apply is therefore
// written by hand, byte for byte what encoding/json would write (held to
// it by FuzzAppendJSONString and TestReportJSONIsEncodingJSONs); everything
// else still goes through encoding/json.

// AppendJSONString appends s as a JSON string, exactly as encoding/json
// writes it: HTML characters (<, >, &) and U+2028/U+2029 escaped, invalid
// UTF-8 replaced by U+FFFD.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendJSON appends the line as encoding/json writes it.
func (l *Line) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"module":`...)
	dst = AppendJSONString(dst, l.Module)
	dst = append(dst, `,"id":`...)
	dst = AppendJSONString(dst, l.ID)
	dst = append(dst, `,"type":`...)
	dst = AppendJSONString(dst, l.Type)
	dst = append(dst, `,"outcome":`...)
	dst = AppendJSONString(dst, string(l.Outcome))
	if l.Detail != "" {
		dst = append(dst, `,"detail":`...)
		dst = AppendJSONString(dst, l.Detail)
	}
	return append(dst, '}')
}

// AppendJSON appends the report as encoding/json writes it. The briefing,
// written only on an adopted node, goes through encoding/json.
func (r *Report) AppendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"outcome":`...)
	dst = AppendJSONString(dst, string(r.Outcome))
	if r.Source != "" {
		dst = append(dst, `,"source":`...)
		dst = AppendJSONString(dst, r.Source)
	}
	if r.Seq != 0 {
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendUint(dst, r.Seq, 10)
	}
	dst = append(dst, `,"lines":`...)
	if r.Lines == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := range r.Lines {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = r.Lines[i].AppendJSON(dst)
		}
		dst = append(dst, ']')
	}
	if r.Refused != "" {
		dst = append(dst, `,"refused":`...)
		dst = AppendJSONString(dst, r.Refused)
	}
	if r.Briefing != nil {
		b, err := json.Marshal(r.Briefing)
		if err != nil {
			return nil, err
		}
		dst = append(dst, `,"briefing":`...)
		dst = append(dst, b...)
	}
	if r.Upgraded != "" {
		dst = append(dst, `,"upgraded":`...)
		dst = AppendJSONString(dst, r.Upgraded)
	}
	return append(dst, '}'), nil
}
