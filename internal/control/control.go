// Package control is agentd's control socket: a Unix socket (mode 0600, owner-only by peer
// credentials) serving JSON over HTTP to `agentd status`, `restart`, `swap` and `publish`.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/agentd/agentd/internal/peercred"
	"github.com/agentd/agentd/internal/supervisor"
)

// SocketName is the control socket's file name in agentd's run directory.
const SocketName = "control.sock"

// Status is the answer of `agentd status --json`.
type Status struct {
	Ready    bool                `json:"ready"`
	Children []supervisor.Status `json:"children"`
}

// Backend is what the control socket operates on.
type Backend interface {
	Statuses() []supervisor.Status
	Ready(ctx context.Context) error
	Restart(ctx context.Context, name string) error
	Swap(ctx context.Context, name, binary, sha256 string, timeout time.Duration) error
	Publish(topic string, payload *anypb.Any) error
}

// SwapRequest is the body of POST /v1/swap.
type SwapRequest struct {
	Name    string        `json:"name"`
	Binary  string        `json:"binary"`
	SHA256  string        `json:"sha256,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Serve serves the control API on a Unix socket at path until ctx ends.
func Serve(ctx context.Context, path string, b Backend) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	os.Remove(path) // a socket left by a killed agentd
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	// An idle connection ends after a while: a client that keeps connections open must not
	// accumulate file descriptors and goroutines in agentd.
	srv := &http.Server{Handler: handler(b), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(peercred.OwnerOnly(l.(*net.UnixListener))); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("control socket: %w", err)
	}
	return nil
}

func handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		writeJSON(w, Status{Ready: b.Ready(ctx) == nil, Children: b.Statuses()})
	})
	mux.HandleFunc("POST /v1/restart/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, b.Restart(r.Context(), r.PathValue("name")))
	})
	mux.HandleFunc("POST /v1/swap", func(w http.ResponseWriter, r *http.Request) {
		var req SwapRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "decode swap request: "+err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, b.Swap(r.Context(), req.Name, req.Binary, req.SHA256, req.Timeout))
	})
	mux.HandleFunc("POST /v1/publish/{topic}", func(w http.ResponseWriter, r *http.Request) {
		var payload anypb.Any
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<20))
		if err == nil {
			err = protojson.Unmarshal(body, &payload)
		}
		if err != nil {
			http.Error(w, "decode payload: "+err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, b.Publish(r.PathValue("topic"), &payload))
	})
	return mux
}

func reply(w http.ResponseWriter, err error) {
	if err != nil {
		code := http.StatusConflict
		if errors.Is(err, supervisor.ErrUnknownChild) {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
