package xdsproxy

import (
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestFrameTypeURL(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		data  []byte
		field *flavour
		resp  bool
		want  string
		fails bool
	}{
		{"sotw request", marshal(&discoveryv3.DiscoveryRequest{VersionInfo: "1", TypeUrl: ListenerType, ResourceNames: []string{"a"}}), sotw, false, ListenerType, false},
		{"delta request", marshal(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: agentv1.TypeNameTable, ResourceNamesSubscribe: []string{"x"}}), delta, false, agentv1.TypeNameTable, false},
		{"sotw response", marshal(&discoveryv3.DiscoveryResponse{TypeUrl: ListenerType, Nonce: "n"}), sotw, true, ListenerType, false},
		{"delta response", marshal(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: agentv1.TypeNameTable}), delta, true, agentv1.TypeNameTable, false},
		{"empty", nil, sotw, true, "", false},
		{"truncated", marshal(&discoveryv3.DiscoveryResponse{TypeUrl: ListenerType})[:5], sotw, true, "", true},
		{"garbage", []byte{0xff, 0xff, 0xff}, sotw, true, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			num := tc.field.requestTypeURL()
			if tc.resp {
				num = tc.field.responseTypeURL()
			}
			f := &frame{typeURLField: num}
			err := codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.data)}, f)
			if (err != nil) != tc.fails {
				t.Fatalf("Unmarshal error = %v, want failure %v", err, tc.fails)
			}
			if err == nil && f.typeURL != tc.want {
				t.Errorf("type URL = %q, want %q", f.typeURL, tc.want)
			}
		})
	}
}

// FuzzTypeURL: whenever protobuf decodes a response, the frame reads the same type URL.
func FuzzTypeURL(f *testing.F) {
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryResponse{TypeUrl: ListenerType, Nonce: "n", VersionInfo: "1"},
		&discoveryv3.DiscoveryResponse{TypeUrl: "a"},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r discoveryv3.DiscoveryResponse
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		got, err := stringField(data, sotw.responseTypeURL())
		if err != nil || got != r.TypeUrl {
			t.Errorf("stringField = %q, %v; protobuf decodes %q", got, err, r.TypeUrl)
		}
	})
}
