package httpgz

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAccepts(t *testing.T) {
	tests := []struct {
		method, accept string
		want           bool
	}{
		{"GET", "", false},
		{"GET", "gzip", true},
		{"GET", "GZIP", true},
		{"GET", "deflate, gzip;q=0.5", true},
		{"GET", "gzip;q=0", false},
		{"GET", "gzip; q=0.0", false},
		{"GET", "gzip;q=oops", false},
		{"GET", "gzip;q=0, gzip", false}, // the first gzip decides, as gzhttp
		{"GET", "*", false},
		{"GET", "x-gzip", false},
		{"HEAD", "gzip", false},
	}
	for _, tc := range tests {
		r := httptest.NewRequest(tc.method, "/", nil)
		r.Header.Set("Accept-Encoding", tc.accept)
		if got := Accepts(r); got != tc.want {
			t.Errorf("%s with Accept-Encoding %q: Accepts = %v, want %v", tc.method, tc.accept, got, tc.want)
		}
	}
}

func TestWrite(t *testing.T) {
	big := strings.Repeat("x", MinSize)
	tests := []struct {
		name, accept, ct, body string
		wantGzip               bool
		wantCT                 string
	}{
		{"at MinSize, gzip accepted", "gzip", "", big, true, "text/plain; charset=utf-8"},
		// Unset on a plain answer: net/http's server sniffs it as it writes.
		{"below MinSize", "gzip", "", big[1:], false, ""},
		{"not accepted", "", "", big, false, ""},
		{"already compressed", "gzip", "application/zip", big, false, "application/zip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Accept-Encoding", tc.accept)
			w := httptest.NewRecorder()
			if tc.ct != "" {
				w.Header().Set("Content-Type", tc.ct)
			}
			Write(w, r, 503, []byte(tc.body))
			res := w.Result()
			if res.StatusCode != 503 {
				t.Errorf("status %d, want 503", res.StatusCode)
			}
			if got := res.Header.Get("Vary"); got != "Accept-Encoding" {
				t.Errorf("Vary %q, want Accept-Encoding", got)
			}
			if got := res.Header.Get("Content-Type"); got != tc.wantCT {
				t.Errorf("Content-Type %q, want %q", got, tc.wantCT)
			}
			body := w.Body.Bytes()
			if gz := res.Header.Get("Content-Encoding") == "gzip"; gz != tc.wantGzip {
				t.Fatalf("gzipped %v, want %v", gz, tc.wantGzip)
			}
			if tc.wantGzip {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if string(body) != tc.body {
				t.Errorf("body of %d bytes, want %d", len(body), len(tc.body))
			}
		})
	}
}
