package kubeprobe

import "testing"

// FuzzParseKubeProbes: ISTIO_KUBE_APP_PROBERS never panics the parser, and whatever it accepts
// has valid paths, one probe kind each and numeric ports.
func FuzzParseKubeProbes(f *testing.F) {
	f.Add(`{"/app-health/a/livez":{"httpGet":{"path":"/x","port":80,"httpHeaders":[{"name":"a","value":"b"}]},"timeoutSeconds":1}}`)
	f.Add(`{"/app-lifecycle/a/prestopz":{"tcpSocket":{"port":"http"}},"/app-health/b/readyz":{"grpc":{"port":9,"service":"s"}}}`)
	f.Add(`{"/app-health/a/livez":null}`)
	f.Fuzz(func(t *testing.T, s string) {
		probes, err := ParseKubeProbes(s)
		if err != nil {
			return
		}
		for path, p := range probes {
			if !probePathPattern().MatchString(path) {
				t.Errorf("accepted path %q", path)
			}
			kinds := 0
			for _, set := range []bool{p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
				if set {
					kinds++
				}
			}
			if kinds != 1 || (p.HTTPGet != nil && p.HTTPGet.Port.IsString) || (p.TCPSocket != nil && p.TCPSocket.Port.IsString) {
				t.Errorf("accepted %q: %+v", path, p)
			}
		}
	})
}
