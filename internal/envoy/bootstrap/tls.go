package bootstrap

import (
	networkingv1 "istio.io/api/networking/v1alpha3"
)

// tlsSocket is the transport socket of a cluster whose ProxyConfig entry has tlsSettings, as
// Istio's tlsContextConvert makes it (an UpstreamTlsContext over agentd's SDS socket; the
// certificates of the files the settings name, or the workload's with ISTIO_MUTUAL), or nil
// without TLS. sniName is the SNI of ISTIO_MUTUAL without one; h2 keeps the ALPN.
func (d *derived) tlsSocket(s *networkingv1.ClientTLSSettings, sniName string, h2 bool) object {
	if s == nil {
		return nil
	}
	metaOr := func(key, v string) string {
		if m := stringOf(d.meta[key]); m != "" {
			return m
		}
		return v
	}
	fileRoot := func() string {
		if ca := metaOr("TLS_CLIENT_ROOT_CERT", s.GetCaCertificates()); ca != "" {
			return "file-root:" + ca
		}
		return ""
	}
	common := object{}
	sni := s.GetSni()
	var alpn []string
	var rootName string
	switch s.GetMode() {
	case networkingv1.ClientTLSSettings_SIMPLE:
		rootName, alpn = fileRoot(), []string{"h2"}
	case networkingv1.ClientTLSSettings_MUTUAL:
		cert, key := metaOr("TLS_CLIENT_CERT_CHAIN", s.GetClientCertificate()), metaOr("TLS_CLIENT_KEY", s.GetPrivateKey())
		if cert != "" && key != "" {
			common["tls_certificate_sds_secret_configs"] = []object{sdsSecret("file-cert:" + cert + "~" + key)}
		}
		rootName, alpn = fileRoot(), []string{"h2"}
	case networkingv1.ClientTLSSettings_ISTIO_MUTUAL:
		common["tls_certificate_sds_secret_configs"] = []object{sdsSecret("default")}
		rootName, alpn = "ROOTCA", []string{"istio", "h2"}
		if sni == "" {
			sni = sniName
		}
	default:
		return nil
	}
	validation := object{}
	if sans := s.GetSubjectAltNames(); len(sans) > 0 {
		var m []object
		for _, san := range sans {
			m = append(m, object{"exact": san})
		}
		validation["match_subject_alt_names"] = m
	}
	combined := object{"default_validation_context": validation}
	if rootName != "" {
		combined["validation_context_sds_secret_config"] = sdsSecret(rootName)
	}
	common["combined_validation_context"] = combined
	if h2 {
		common["alpn_protocols"] = alpn
	}
	ctx := object{"common_tls_context": common}
	if sni != "" {
		ctx["sni"] = sni
	}
	return object{"name": "envoy.transport_sockets.tls",
		"typed_config": typed("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext", ctx)}
}

// sdsSecret is an SDS secret of agentd's SDS socket (the sds-grpc cluster), in the JSON
// names Istio writes (protobuf's field names); the workload's own ("default", "ROOTCA") are
// awaited without a fetch timeout.
func sdsSecret(name string) object {
	src := object{
		"api_config_source": object{
			"api_type":                       "GRPC",
			"set_node_on_first_message_only": true,
			"transport_api_version":          "V3",
			"grpc_services":                  []object{{"envoy_grpc": object{"cluster_name": "sds-grpc"}}},
		},
		"resource_api_version": "V3",
	}
	if name == "default" || name == "ROOTCA" {
		src["initial_fetch_timeout"] = "0s"
	}
	return object{"name": name, "sds_config": src}
}
