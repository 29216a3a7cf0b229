package status

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestIdleFloodKeepsProbesAnswered: connections that send nothing, and keep-alive connections
// left idle after one request, beyond the cap are closed by the server, oldest first; the
// readiness probe that comes after them is answered.
func TestIdleFloodKeepsProbesAnswered(t *testing.T) {
	const max, flood = 8, 40
	_, base := start(t, Config{MaxConns: max}, "")
	addr := base[len("http://"):]
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if i%2 == 1 { // one request, then idle on a kept-alive connection
			io.WriteString(c, "GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 512)
			if _, err := c.Read(buf); err != nil {
				t.Fatalf("flood request %d: %v", i, err)
			}
		}
	}
	if code, _, _ := do(t, http.MethodGet, base+"/healthz/ready", nil); code != http.StatusOK {
		t.Fatalf("readiness during the flood = %d, want 200", code)
	}
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 512)); !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed < flood-max {
		t.Errorf("%d of %d flood connections closed by the server, want at least %d (cap %d)", closed, flood, flood-max, max)
	}
}
