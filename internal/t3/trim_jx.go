package t3

import (
	"encoding/json"
	"slices"
	"strconv"

	"github.com/go-faster/jx"
)

// trimBoundedJX is trimBounded written on jx's Decoder (Raw and Skip)
// instead of the hand-written scanner: the same output for the same input.
// jx has no way to learn where a value starts, so each element whose fields
// decide (a run, message, checkpoint or request) is taken with Raw (one skip)
// and then read again for its keys.
func trimBoundedJX(body []byte, k Keep) (out []byte, runs int, err error) {
	t := trimmer{k: k}
	d := jx.DecodeBytes(body)
	out = make([]byte, 0, 4096)
	out = append(out, '{')
	first := true
	err = d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(append(append(out, '"'), key...), '"', ':')
		raw, err := d.Raw()
		if err != nil {
			return err
		}
		if string(key) != "projection" {
			out = append(out, raw...)
			return nil
		}
		out, err = t.projectionJX(out, raw)
		return err
	})
	if err != nil {
		return nil, 0, errShape
	}
	if d.Next() != jx.Invalid { // trailing data
		return nil, 0, errShape
	}
	out = append(out, '}')
	if !json.Valid(out) {
		return nil, 0, errShape
	}
	return out, t.runs, nil
}

func (t *trimmer) projectionJX(out []byte, raw []byte) ([]byte, error) {
	type field struct {
		key []byte
		val []byte
	}
	var fields []field
	err := jx.DecodeBytes(raw).ObjBytes(func(d *jx.Decoder, key []byte) error {
		v, err := d.Raw()
		fields = append(fields, field{key, v})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.runIDs, t.msgIDs, t.checkpointIDs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, id := range t.k.MessageIDs {
		t.msgIDs[id] = true
	}
	var keptRuns [][]byte
	for _, f := range fields {
		if string(f.key) == "runs" {
			if keptRuns, err = t.keepRunsJX(f.val); err != nil {
				return nil, err
			}
		}
	}
	out = append(out, '{')
	for i, f := range fields {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(append(out, '"'), f.key...), '"', ':')
		switch string(f.key) {
		case "runs":
			out = append(out, '[')
			for j, r := range keptRuns {
				if j > 0 {
					out = append(out, ',')
				}
				out = append(out, r...)
			}
			out = append(out, ']')
		case "messages":
			out, err = filterJX(out, f.val, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.msgIDs[string(id)]
			})
		case "checkpoints":
			out, err = filterJX(out, f.val, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.checkpointIDs[string(id)]
			})
		case "runtimeRequests":
			out, err = filterJX(out, f.val, func(id, _, status []byte) bool {
				return string(status) == "pending" || contains(t.k.RequestIDs, id)
			})
		default:
			out = append(out, f.val...)
		}
		if err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// strField reads a string value, or skips a value of another type (ok false).
func strField(d *jx.Decoder) (v []byte, ok bool, err error) {
	if d.Next() != jx.String {
		return nil, false, d.Skip()
	}
	v, err = d.StrBytes()
	return v, err == nil, err
}

func (t *trimmer) keepRunsJX(raw []byte) ([][]byte, error) {
	n := max(1, t.k.Runs)
	type runJX struct {
		raw     []byte
		pos     int
		ordinal int64
		named   bool
	}
	var newest, named []runJX
	pos := 0
	sub := jx.DecodeBytes(nil) // reused for every element
	err := jx.DecodeBytes(raw).Arr(func(d *jx.Decoder) error {
		t.runs++
		el, err := d.Raw()
		if err != nil {
			return err
		}
		r := runJX{raw: el, pos: pos}
		pos++
		sub.ResetBytes(el)
		err = sub.ObjBytes(func(d *jx.Decoder, key []byte) error {
			switch string(key) {
			case "ordinal":
				v, err := d.Raw()
				if err != nil {
					return err
				}
				r.ordinal, _ = strconv.ParseInt(string(v), 10, 64)
				return nil
			case "id":
				id, ok, err := strField(d)
				r.named = r.named || ok && contains(t.k.RunIDs, id)
				return err
			case "userMessageId":
				id, ok, err := strField(d)
				r.named = r.named || ok && contains(t.k.MessageIDs, id)
				return err
			}
			return d.Skip()
		})
		if err != nil {
			return err
		}
		switch {
		case r.named:
			named = append(named, r)
		case len(newest) < n || r.ordinal > newest[0].ordinal:
			i, _ := slices.BinarySearchFunc(newest, r.ordinal, func(x runJX, o int64) int {
				switch {
				case x.ordinal < o:
					return -1
				case x.ordinal > o:
					return 1
				}
				return 0
			})
			newest = slices.Insert(newest, i, r)
			if len(newest) > n {
				newest = newest[1:]
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	kept := append(newest, named...)
	slices.SortFunc(kept, func(a, b runJX) int { return a.pos - b.pos })
	out := make([][]byte, len(kept))
	for i, r := range kept {
		out[i] = r.raw
		if err := t.noteJX(r.raw); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (t *trimmer) noteJX(raw []byte) error {
	return jx.DecodeBytes(raw).ObjBytes(func(d *jx.Decoder, key []byte) error {
		var into map[string]bool
		switch string(key) {
		case "id":
			into = t.runIDs
		case "userMessageId":
			into = t.msgIDs
		case "checkpointId":
			into = t.checkpointIDs
		default:
			return d.Skip()
		}
		v, ok, err := strField(d)
		if ok {
			into[string(v)] = true
		}
		return err
	})
}

func filterJX(out, raw []byte, keep func(id, runID, status []byte) bool) ([]byte, error) {
	out = append(out, '[')
	first := true
	sub := jx.DecodeBytes(nil) // reused for every element
	err := jx.DecodeBytes(raw).Arr(func(d *jx.Decoder) error {
		el, err := d.Raw()
		if err != nil {
			return err
		}
		var id, runID, status []byte
		sub.ResetBytes(el)
		err = sub.ObjBytes(func(d *jx.Decoder, key []byte) error {
			var into *[]byte
			switch string(key) {
			case "id":
				into = &id
			case "runId":
				into = &runID
			case "status":
				into = &status
			default:
				return d.Skip()
			}
			v, ok, err := strField(d)
			if ok {
				*into = v
			}
			return err
		})
		if err != nil {
			return err
		}
		if keep(id, runID, status) {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, el...)
		}
		return nil
	})
	return append(out, ']'), err
}
