package connpass

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unixPair is a connected pair of Unix stream connections.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := osFile(fd)
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// tcpPair is a connected pair of loopback TCP connections: the client's end and the server's.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestSendReceive: two connections handed over one after the other arrive with their data
// first and the rest of the client's bytes after it, and the receiver answers on them while
// the sender's copy is closed.
func TestSendReceive(t *testing.T) {
	from, to := unixPair(t)
	s := NewSender(from)
	for i, data := range []string{"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", strings.Repeat("y", 300<<10)} {
		client, server := tcpPair(t)
		type received struct {
			c   *Conn
			err error
		}
		done := make(chan received, 1) // the receiver reads while a large message is sent
		go func() { c, err := Receive(to, s); done <- received{c, err} }()
		if err := s.Send(server, []byte(data)); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		server.Close() // the receiver's copy keeps the socket open
		r := <-done
		got, err := r.c, r.err
		if err != nil {
			t.Fatalf("Receive %d: %v", i, err)
		}
		if _, err := io.WriteString(client, "more"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(data)+4)
		got.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(got, buf); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if string(buf) != data+"more" {
			t.Errorf("connection %d read %.40q..., want its data then the client's bytes", i, buf)
		}
		if _, err := io.WriteString(got, "answer"); err != nil {
			t.Fatal(err)
		}
		got.Close()
		client.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := io.ReadAll(client); err != nil || string(b) != "answer" {
			t.Errorf("client %d read %q, %v; want answer and the end", i, b, err)
		}
	}
}

// TestReceiveBadMessages: a message without a descriptor or too large is an error, and a
// closed peer is io.EOF.
func TestReceiveBadMessages(t *testing.T) {
	header := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	tests := []struct {
		name string
		send func(t *testing.T, c *net.UnixConn)
		want string
	}{
		{"no descriptor", func(t *testing.T, c *net.UnixConn) { c.Write(append(header(2), "hi"...)) }, "want one descriptor, got 0"},
		{"too large", func(t *testing.T, c *net.UnixConn) {
			_, server := tcpPair(t)
			if err := NewSender(c).Send(server, make([]byte, 16)); err != nil {
				t.Fatal(err)
			}
			// The next message claims more than the limit.
			raw, _ := server.(*net.TCPConn).SyscallConn()
			raw.Control(func(fd uintptr) { c.WriteMsgUnix(header(maxMessage+1), unix.UnixRights(int(fd)), nil) })
		}, "more than"},
		{"peer closed", func(t *testing.T, c *net.UnixConn) { c.Close() }, "EOF"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, to := unixPair(t)
			tc.send(t, from)
			var err error
			for range 2 { // "too large" sends a good message first
				var c *Conn
				if c, err = Receive(to, nil); err != nil {
					break
				}
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Receive: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestHead: the request as net/http read it, written again for the receiver to read.
func TestHead(t *testing.T) {
	raw := "GET /app-health/a/readyz?x=1 HTTP/1.1\r\nHost: 10.0.0.1:15020\r\nUser-Agent: kube-probe/1.33\r\n" +
		"X-Multi: a\r\nX-Multi: b\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc"
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	again, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(Head(r, body)))))
	if err != nil {
		t.Fatalf("read Head's output: %v", err)
	}
	body2, _ := io.ReadAll(again.Body)
	if again.Method != r.Method || again.RequestURI != r.RequestURI || again.Host != r.Host || !again.Close ||
		strings.Join(again.Header["X-Multi"], ",") != "a,b" || again.UserAgent() != "kube-probe/1.33" || string(body2) != "abc" {
		t.Errorf("read again: %s %s Host %q close %v headers %v body %q", again.Method, again.RequestURI, again.Host, again.Close, again.Header, body2)
	}
}

func osFile(fd int) *os.File { return os.NewFile(uintptr(fd), "socketpair") }
