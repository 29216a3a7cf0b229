// Package configcheck checks Envoy configuration as Envoy does before using it: the
// protoc-gen-validate rules of go-control-plane's types, including the messages packed in Any
// fields. It links those types (the whole bootstrap tree and the extensions agentd's
// bootstrap names), so only tests and the Envoy stand-in import it; agentd's binary builds its
// bootstrap as JSON without them (package envoy).
package configcheck

import (
	"errors"
	"fmt"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	// The types agentd's bootstrap packs in Any fields: decoding and validation must know them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/bootstrap/internal_listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/brotli/compressor/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/gzip/compressor/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/zstd/compressor/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/compressor/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// istioProxyTypes are extension types that only Istio's Envoy build knows; a TypedStruct of
// one of them cannot be checked here and is accepted as it is.
var istioProxyTypes = map[string]bool{
	"type.googleapis.com/istio.workload.BootstrapExtension": true,
}

// ParseBootstrap decodes a JSON bootstrap strictly (an unknown field or type is an error) and
// validates it fully (see Validate).
func ParseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("decode bootstrap: %w", err)
	}
	if err := Validate(b); err != nil {
		return nil, err
	}
	return b, nil
}

// Validate runs the protoc-gen-validate rules of m and of every message packed inside it:
// Any payloads (which ValidateAll does not enter) and TypedStruct values of known types. A
// payload of a type this binary does not know is an error.
func Validate(m proto.Message) error {
	return validator{}.tree(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()))
}

// ValidateKnown is Validate, except that payloads of types this binary does not know (Istio's
// own filters, extensions not compiled in) are accepted unchecked.
func ValidateKnown(m proto.Message) error {
	return validator{allowUnknown: true}.tree(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()))
}

type validator struct{ allowUnknown bool }

type allValidator interface{ ValidateAll() error }

func (v validator) tree(m protoreflect.Message, path string) error {
	if av, ok := m.Interface().(allValidator); ok {
		if err := av.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, fv protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := fv.List()
			for i := 0; i < l.Len(); i++ {
				errs = append(errs, v.value(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i)))
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			fv.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				errs = append(errs, v.value(mv.Message(), fmt.Sprintf("%s[%q]", p, k.String())))
				return true
			})
		default:
			errs = append(errs, v.value(fv.Message(), p))
		}
		return true
	})
	return errors.Join(errs...)
}

// validateValue validates one message, unpacking it first when it is an Any or TypedStruct.
func (v validator) value(m protoreflect.Message, path string) error {
	switch x := m.Interface().(type) {
	case *anypb.Any:
		inner, err := x.UnmarshalNew()
		if v.allowUnknown && errors.Is(err, protoregistry.NotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: unpack %s: %w", path, x.GetTypeUrl(), err)
		}
		return v.value(inner.ProtoReflect(), path+"<"+string(inner.ProtoReflect().Descriptor().FullName())+">")
	case *udpav1.TypedStruct:
		return v.typedStruct(x.GetTypeUrl(), x.GetValue(), path)
	case *xdstypev3.TypedStruct:
		return v.typedStruct(x.GetTypeUrl(), x.GetValue(), path)
	}
	return v.tree(m, path)
}

func (v validator) typedStruct(typeURL string, value *structpb.Struct, path string) error {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		if istioProxyTypes[typeURL] || v.allowUnknown {
			return nil
		}
		return fmt.Errorf("%s: TypedStruct of unknown type %s", path, typeURL)
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	inner := mt.New().Interface()
	if err := protojson.Unmarshal(js, inner); err != nil {
		return fmt.Errorf("%s: TypedStruct of %s: %w", path, typeURL, err)
	}
	return v.value(inner.ProtoReflect(), path+"<"+string(mt.Descriptor().FullName())+">")
}
