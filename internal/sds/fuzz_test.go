package sds

import "testing"

// FuzzParseFileResource: an SDS resource name from a client never panics; a file-cert or
// file-root name it accepts is written back by FileCertResource or FileRootResource exactly.
func FuzzParseFileResource(f *testing.F) {
	for _, s := range []string{"default", "ROOTCA", "file-cert:/etc/certs/cert-chain.pem~/etc/certs/key.pem",
		"file-root:/etc/certs/root-cert.pem", "file-cert:a~b~c", "file-root:", "file-cert:~", "file-root:system"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		r, ok := parseFileResource(name)
		if !ok {
			return
		}
		var back string
		switch {
		case r.root != "" && r.cert == "" && r.key == "":
			back = FileRootResource(r.root)
		case r.root == "" && r.cert != "" && r.key != "":
			back = FileCertResource(r.cert, r.key)
		default:
			t.Fatalf("parseFileResource(%q) = %+v: neither a pair nor a root", name, r)
		}
		if back != name {
			t.Fatalf("parseFileResource(%q) = %+v, which writes back as %q", name, r, back)
		}
	})
}
