package prober

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// benchAppEnv makes the test binary the probed app (benchAppMain): a process of its own, so
// that the benchmark's CPU time and profile are the prober's and its clients', not the app's.
const benchAppEnv = "AGENTD_PROBER_BENCH_APP"

// benchAppMain answers /ok with "ok" on a loopback port it prints, until stdin closes.
func benchAppMain() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
}

// startBenchApp runs the app in a child process and returns its port and a function that
// reads the child's CPU time so far.
func startBenchApp(b *testing.B) (port int, cpu func() (user, sys time.Duration)) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchAppEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("the app's port: %v", err)
	}
	if port, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		b.Fatalf("the app's port %q: %v", line, err)
	}
	return port, func() (time.Duration, time.Duration) { return procCPU(b, cmd.Process.Pid) }
}

// procCPU is a process's user and system CPU time (/proc/PID/stat).
func procCPU(b *testing.B, pid int) (user, sys time.Duration) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: utime and stime are the
	// 12th and 13th of them, in clock ticks (100 per second on Linux).
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.Atoi(fields[11])
	st, _ := strconv.Atoi(fields[12])
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}

func selfCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// BenchmarkHandedProbe is kubelet's httpGet probe as the prober serves it at a flood's rate:
// 16 clients, each on its own keep-alive connection to the status server, whose first request
// hands the connection to the prober (as agentd's status server does); every request after
// that is read by the prober on the handed connection and probes the app (a child process)
// on a new connection from 127.0.0.6. Besides ns/op and allocs/op it reports the CPU time per
// probe of this process (the prober and the clients, user and system) and of the app.
// Run with -cpuprofile to see where the prober's time goes.
func BenchmarkHandedProbe(b *testing.B) {
	port, appCPU := startBenchApp(b)
	_, _, addr := startProberAt(b, &agentv1.ProberConfig{PodIp: "127.0.0.1", StatusPort: 15020, KubeAppProbers: probesJSON(map[string]string{
		"/app-health/app/readyz": fmt.Sprintf(`{"httpGet":{"path":"/ok","port":%d},"timeoutSeconds":1}`, port),
	})})
	benchProbes(b, addr, appCPU)
}

// BenchmarkProbeFloor is what BenchmarkHandedProbe cannot go below in Go: the same clients
// and app, served by the least a prober does per probe (read the request with net/http's
// ReadRequest, dial the app from 127.0.0.6 with SO_LINGER as the prober does, write a fixed
// request, read the answer with ReadResponse, close, write a fixed answer), without a status
// server, connection handing, net/http's server, headers or bodies. Its system time is the
// kernel's share of a probe: two connections' worth of loopback TCP.
func BenchmarkProbeFloor(b *testing.B) {
	port, appCPU := startBenchApp(b)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	dialer := plainProbeDialer(sourceIPv4)
	appAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	probe := []byte("GET /ok HTTP/1.1\r\nHost: " + appAddr + "\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n")
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	serve := func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		abuf := bufio.NewReader(nil)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_ = req.Body.Close()
			ac, err := dialer.Dial("tcp", appAddr)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = ac.Write(probe)
			abuf.Reset(ac)
			resp, err := http.ReadResponse(abuf, req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			_ = ac.Close()
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	benchProbes(b, l.Addr().String(), appCPU)
}

// benchProbes runs kubelet's probes against the status port at addr: 16 clients, each on a
// keep-alive connection of its own, as wrk -c16.
func benchProbes(b *testing.B, addr string, appCPU func() (time.Duration, time.Duration)) {
	req := []byte("GET /app-health/app/readyz HTTP/1.1\r\nHost: 127.0.0.1:15020\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n")
	u0, s0 := selfCPU()
	au0, as0 := appCPU()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 clients, as wrk -c16
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for pb.Next() {
			if _, err := conn.Write(req); err != nil {
				b.Error(err)
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	u1, s1 := selfCPU()
	au1, as1 := appCPU()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(u1-u0), "user-µs/op")
	b.ReportMetric(per(s1-s0), "sys-µs/op")
	b.ReportMetric(per(au1-au0+as1-as0), "app-µs/op")
}
