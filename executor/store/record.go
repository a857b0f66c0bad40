package store

import (
	"encoding/json"
	"slices"
	"strconv"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The journal's records are written by hand, byte for byte as
// encoding/json writes them (TestRecordJSONIsEncodingJSONs holds the two
// together): every apply writes records, and encoding/json's first use of
// each record type costs a short rescue process more than its own work.
// They are still read with encoding/json (only after a crash or between
// compactions, and a reader must be strict, not fast).

func appendRecordJSON(b []byte, r *record) []byte {
	b = append(b, `{"n":`...)
	b = strconv.AppendUint(b, r.N, 10)
	b = append(b, `,"op":`...)
	b = shapes.AppendJSONString(b, r.Op)
	b = append(b, `,"target":`...)
	b = shapes.AppendJSONString(b, r.Target)
	if r.Entry != nil {
		b = append(b, `,"entry":`...)
		b = jsonEntry(b, r.Entry)
	}
	if r.Intent != nil {
		b = append(b, `,"intent":`...)
		b = jsonIntent(b, r.Intent)
	}
	if len(r.Lines) > 0 {
		lines, _ := json.Marshal(r.Lines)
		b = append(append(b, `,"lines":`...), lines...)
	}
	if r.Began != nil {
		began, _ := json.Marshal(r.Began)
		b = append(append(b, `,"began":`...), began...)
	}
	if r.PID != 0 {
		b = append(b, `,"pid":`...)
		b = strconv.AppendInt(b, int64(r.PID), 10)
	}
	if r.Format != 0 {
		b = append(b, `,"format":`...)
		b = strconv.AppendInt(b, int64(r.Format), 10)
	}
	return append(b, '}')
}

func jsonEntry(b []byte, e *Entry) []byte {
	b = append(b, `{"target":`...)
	b = shapes.AppendJSONString(b, e.Target)
	b = append(b, `,"type":`...)
	b = shapes.AppendJSONString(b, e.Type)
	b = append(b, `,"claims":`...)
	if e.Claims == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range e.Claims {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonClaim(b, &e.Claims[i])
		}
		b = append(b, ']')
	}
	b = append(b, `,"order":`...)
	b = strconv.AppendUint(b, e.Order, 10)
	b = jsonFlag(b, `,"created":true`, e.Created)
	b = jsonFlag(b, `,"held":true`, e.Held)
	b = jsonFlag(b, `,"recovered":true`, e.Recovered)
	if e.Original != nil {
		b = append(b, `,"original":`...)
		b = jsonOriginal(b, e.Original)
	}
	if e.Digest != "" {
		b = append(b, `,"digest":`...)
		b = shapes.AppendJSONString(b, e.Digest)
	}
	b = jsonUint32(b, `,"mode":`, e.Mode, true)
	b = jsonUint32(b, `,"uid":`, e.UID, true)
	b = jsonUint32(b, `,"gid":`, e.GID, true)
	if len(e.Paths) > 0 {
		b = append(b, `,"paths":`...)
		b = jsonStrings(b, e.Paths)
	}
	if e.Pending != nil {
		b = append(b, `,"pending":`...)
		b = jsonIntent(b, e.Pending)
	}
	b = jsonFlag(b, `,"stub":true`, e.Stub)
	return append(b, '}')
}

func jsonIntent(b []byte, in *Intent) []byte {
	b = append(b, `{"op":`...)
	b = shapes.AppendJSONString(b, in.Op)
	b = jsonFlag(b, `,"created":true`, in.Created)
	if in.Original != nil {
		b = append(b, `,"original":`...)
		b = jsonOriginal(b, in.Original)
	}
	b = append(b, `,"claim":`...)
	b = jsonClaim(b, &in.Claim)
	b = append(b, `,"type":`...)
	b = shapes.AppendJSONString(b, in.Type)
	if len(in.Paths) > 0 {
		b = append(b, `,"paths":`...)
		b = jsonStrings(b, in.Paths)
	}
	if in.Digest != "" {
		b = append(b, `,"digest":`...)
		b = shapes.AppendJSONString(b, in.Digest)
	}
	return append(b, '}')
}

func jsonOriginal(b []byte, o *Original) []byte {
	b = append(b, `{"kind":`...)
	b = shapes.AppendJSONString(b, o.Kind)
	if o.Digest != "" {
		b = append(b, `,"digest":`...)
		b = shapes.AppendJSONString(b, o.Digest)
	}
	b = jsonUint32(b, `,"mode":`, o.Mode, false)
	b = jsonUint32(b, `,"uid":`, o.UID, false)
	b = jsonUint32(b, `,"gid":`, o.GID, false)
	b = jsonFlag(b, `,"running":true`, o.Running)
	if o.Enabled != "" {
		b = append(b, `,"enabled":`...)
		b = shapes.AppendJSONString(b, o.Enabled)
	}
	b = jsonFlag(b, `,"enabled_set":true`, o.EnabledSet)
	b = jsonFlag(b, `,"absent":true`, o.Absent)
	return append(b, '}')
}

func jsonClaim(b []byte, c *Claim) []byte {
	b = append(b, `{"source":`...)
	b = shapes.AppendJSONString(b, string(c.Source))
	b = append(b, `,"module":`...)
	b = shapes.AppendJSONString(b, c.Module)
	b = append(b, `,"id":`...)
	b = shapes.AppendJSONString(b, c.ID)
	return append(b, '}')
}

func jsonStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = shapes.AppendJSONString(b, s)
	}
	return append(b, ']')
}

// jsonFlag appends text (a key and true) when set: a bool with omitempty.
func jsonFlag(b []byte, text string, set bool) []byte {
	if set {
		b = append(b, text...)
	}
	return b
}

// jsonUint32 appends key and v, unless omitEmpty and v is 0.
func jsonUint32(b []byte, key string, v uint32, omitEmpty bool) []byte {
	if v == 0 && omitEmpty {
		return b
	}
	b = append(b, key...)
	return strconv.AppendUint(b, uint64(v), 10)
}

// jsonSummary is the report summary as encoding/json writes it (map keys
// sorted).
func jsonSummary(b []byte, sum *ReportSummary) []byte {
	b = append(b, `{"source":`...)
	b = shapes.AppendJSONString(b, sum.Source)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, sum.Seq, 10)
	b = append(b, `,"outcome":`...)
	b = shapes.AppendJSONString(b, string(sum.Outcome))
	b = append(b, `,"lines":`...)
	if sum.Lines == nil {
		return append(b, "null}"...)
	}
	keys := make([]shapes.Outcome, 0, len(sum.Lines))
	for k := range sum.Lines {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = shapes.AppendJSONString(b, string(k))
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(sum.Lines[k]), 10)
	}
	return append(b, "}}"...)
}
