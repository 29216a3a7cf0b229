package xdsproxy

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec codec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// frame is an xDS message passed through as the bytes it arrived as: requests and responses
// reach the other end unchanged, and the proxy does not pay to decode and re-encode them.
// Only the type URL is read; the few types the proxy handles itself are decoded in full.
type frame struct {
	typeURLField protowire.Number // where the message type keeps its type_url; set before reading
	data         []byte
	typeURL      string
}

// codec passes frames through as bytes and encodes everything else as protobuf. Its name is
// "proto", so the wire content type stays the usual one.
type codec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.data)}, nil
	}
	return protoCodec.Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	f.data = data.Materialize() // a copy: data is freed when this returns
	t, err := stringField(f.data, f.typeURLField)
	if err != nil {
		return fmt.Errorf("malformed xDS message: %w", err)
	}
	f.typeURL = t
	return nil
}

// stringField returns the value of the top-level string field num of an encoded message (the
// last one wins, as in protobuf decoding), checking that the top level is well formed.
func stringField(b []byte, num protowire.Number) (string, error) {
	var out string
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return "", protowire.ParseError(l)
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return "", protowire.ParseError(l)
			}
			out = string(v)
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return "", protowire.ParseError(l)
		}
		b = b[l:]
	}
	return out, nil
}
