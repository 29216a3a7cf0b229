package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/missing":
			http.NotFound(w, r)
		case "/broken":
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
		}
	}))
	defer srv.Close()
	tests := []struct {
		method, path, body string
		want               string
		wantErr            string
	}{
		{"POST", "drain", "", "POST /drain ", ""},
		{"GET", "/server_info", "", "GET /server_info ", ""},
		{"POST", "logging?level=debug", "x", "POST /logging x", ""},
		{"GET", "missing", "", "404 page not found\n", ""}, // 404 is not an error, as pilot-agent
		{"GET", "broken", "", "", "status 500: boom"},
	}
	for _, tt := range tests {
		got, err := doRequest(srv.URL, tt.method, tt.path, tt.body)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("doRequest(%s %s) = %v, want error %q", tt.method, tt.path, err, tt.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("doRequest(%s %s) = %q, %v; want %q", tt.method, tt.path, got, err, tt.want)
		}
	}
	if _, err := request(8080, "GET", "x", ""); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Errorf("request to port 8080 = %v, want refused", err)
	}
}
