package wasm

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/agentd/agentd/internal/wasm/wasmtest"
)

func newTestCache(t testing.TB, o Options) (*Cache, *Metrics) {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCache(o, hclog.NewNullLogger(), m)
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

func TestGet(t *testing.T) {
	module := wasmtest.Module("get")
	srv := wasmtest.Start(t, module)
	sum := wasmtest.SHA256(module)
	tests := []struct {
		name, url, checksum string
		wantErr             string
	}{
		{name: "http", url: srv.HTTP + "/plugin.wasm"},
		{name: "http with sha256", url: srv.HTTP + "/plugin.wasm", checksum: sum},
		{name: "http gzip", url: srv.HTTP + "/plugin.wasm.gz"},
		{name: "http tar.gz", url: srv.HTTP + "/plugin.tar.gz", checksum: ""},
		{name: "http wrong sha256", url: srv.HTTP + "/plugin.wasm", checksum: strings.Repeat("0", 64), wantErr: "has checksum"},
		{name: "http not hex", url: srv.HTTP + "/plugin.wasm", checksum: "../../etc/passwd", wantErr: "not a sha256"},
		{name: "http 404", url: srv.HTTP + "/missing", wantErr: "404"},
		{name: "oci artifact", url: "oci://" + srv.Images[wasmtest.Artifact]},
		{name: "oci compat", url: "oci://" + srv.Images[wasmtest.Compat]},
		{name: "oci docker", url: "oci://" + srv.Images[wasmtest.Docker]},
		{name: "oci digest checked", url: "oci://" + srv.Images[wasmtest.Compat], checksum: srv.Digests[wasmtest.Compat]},
		{name: "oci wrong digest", url: "oci://" + srv.Images[wasmtest.Compat], checksum: strings.Repeat("1", 64), wantErr: "has checksum"},
		{name: "oci by digest", url: "oci://" + strings.TrimSuffix(srv.Images[wasmtest.Artifact], ":v1") + "@sha256:" + srv.Digests[wasmtest.Artifact]},
		{name: "oci missing tag", url: "oci://" + srv.Registry + "/wasm/none:v1", wantErr: "manifest"},
		{name: "scheme", url: "ftp://example.com/x.wasm", wantErr: "unsupported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newTestCache(t, Options{})
			p, err := c.Get(t.Context(), tc.url, GetOptions{Checksum: tc.checksum, Timeout: 10 * time.Second})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Get(%s) = %q, %v, want an error with %q", tc.url, p, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Get(%s): %v", tc.url, err)
			}
			b, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(b, module) {
				t.Fatalf("Get(%s) = %s holding %q, %v; want the module", tc.url, p, b, err)
			}
			if !strings.HasPrefix(p, c.o.Dir) || !strings.HasSuffix(p, ".wasm") {
				t.Errorf("Get(%s) = %s, want a .wasm file under %s", tc.url, p, c.o.Dir)
			}
		})
	}
}

func TestCacheHitAndRestart(t *testing.T) {
	module := wasmtest.Module("restart")
	srv := wasmtest.Start(t, module)
	dir := t.TempDir()
	tests := []struct{ name, url, checksum string }{
		{"http", srv.HTTP + "/plugin.wasm", wasmtest.SHA256(module)},
		{"oci", "oci://" + srv.Images[wasmtest.Compat], srv.Digests[wasmtest.Compat]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, m := newTestCache(t, Options{Dir: dir})
			o := GetOptions{Checksum: tc.checksum, Timeout: 10 * time.Second}
			first, err := c.Get(t.Context(), tc.url, o)
			if err != nil {
				t.Fatal(err)
			}
			before := srv.Requests.Load()
			if again, err := c.Get(t.Context(), tc.url, o); err != nil || again != first {
				t.Fatalf("second Get = %s, %v, want %s", again, err, first)
			}
			if n := srv.Requests.Load() - before; n != 0 {
				t.Errorf("second Get made %d requests, want 0", n)
			}
			if hits := value(t, m.cacheLookups.WithLabelValues("true")); hits != 1 {
				t.Errorf("cache hits = %v, want 1", hits)
			}
			// A new process on the same directory uses the file without fetching.
			c2, _ := newTestCache(t, Options{Dir: dir})
			if p, err := c2.Get(t.Context(), tc.url, o); err != nil || p != first {
				t.Fatalf("Get after a restart = %s, %v, want %s", p, err, first)
			}
			if n := srv.Requests.Load() - before; n != 0 {
				t.Errorf("Get after a restart made %d requests, want 0", n)
			}
		})
	}
}

func TestLeftoversRemoved(t *testing.T) {
	dir := t.TempDir()
	half := filepath.Join(dir, "abc", strings.Repeat("a", 64)+".wasm.tmp123")
	os.MkdirAll(filepath.Dir(half), 0o755)
	os.WriteFile(half, []byte("\x00asm"), 0o644)
	newTestCache(t, Options{Dir: dir})
	if _, err := os.Stat(half); !os.IsNotExist(err) {
		t.Errorf("half-written %s still there (%v)", half, err)
	}
}

func TestRefused(t *testing.T) {
	srv := wasmtest.Start(t, wasmtest.Module("refused"))
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	tests := []struct {
		name    string
		o       Options
		url     string
		timeout time.Duration
		wantErr string
	}{
		{name: "blocked cidr http", o: Options{BlockedCIDRs: loopback}, url: srv.HTTP + "/plugin.wasm", wantErr: "blocked"},
		{name: "blocked cidr oci", o: Options{BlockedCIDRs: loopback}, url: "oci://" + srv.Images[wasmtest.Compat], wantErr: "blocked"},
		{name: "link-local", url: "http://169.254.169.254/latest/meta-data", wantErr: "link-local"},
		{name: "cloud metadata", url: "http://100.100.100.200/x.wasm", wantErr: "metadata"},
		{name: "size bound", o: Options{MaxBinarySize: 1 << 10}, url: srv.HTTP + "/big", wantErr: "larger than 1024"},
		{name: "pull timeout", url: srv.HTTP + "/slow", timeout: 300 * time.Millisecond, wantErr: "deadline"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, m := newTestCache(t, tc.o)
			if tc.timeout == 0 {
				tc.timeout = 10 * time.Second
			}
			start := time.Now()
			p, err := c.Get(t.Context(), tc.url, GetOptions{Timeout: tc.timeout})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Get(%s) = %q, %v, want an error with %q", tc.url, p, err, tc.wantErr)
			}
			if d := time.Since(start); d > tc.timeout+2*time.Second {
				t.Errorf("Get took %v, beyond its %v timeout", d, tc.timeout)
			}
			failures := value(t, m.remoteFetches.WithLabelValues(downloadFailure)) + value(t, m.remoteFetches.WithLabelValues(manifestFailure))
			if failures != 1 {
				t.Errorf("failed fetches counted = %v, want 1", failures)
			}
		})
	}
}

func TestCheckRealms(t *testing.T) {
	tests := []struct {
		header string
		ok     bool
	}{
		{`Bearer realm="https://auth.docker.io/token",service="registry.docker.io"`, true},
		{`Bearer realm="http://169.254.169.254/token"`, false},
		{`Bearer realm="http://10.0.0.1/token"`, false},
		{`Bearer realm="https://localhost/token"`, false},
		{`Bearer realm="https://metadata.google.internal/x"`, false},
		{`Bearer realm="file:///etc/passwd"`, false},
		{`Basic realm="https://ok.example.com", Bearer realm="http://127.0.0.1/"`, false},
	}
	for _, tc := range tests {
		if err := checkRealms(tc.header); (err == nil) != tc.ok {
			t.Errorf("checkRealms(%s) = %v, want ok %v", tc.header, err, tc.ok)
		}
	}
}

func TestPurge(t *testing.T) {
	module := wasmtest.Module("purge")
	srv := wasmtest.Start(t, module)
	c, m := newTestCache(t, Options{ModuleExpiry: time.Minute})
	p, err := c.Get(t.Context(), srv.HTTP+"/plugin.wasm", GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.purge(time.Now())
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("a module in use was purged: %v", err)
	}
	c.purge(time.Now().Add(2 * time.Minute))
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("an expired module is still there: %v", err)
	}
	if n := value(t, m.cacheEntries.WithLabelValues()); n != 0 {
		t.Errorf("cache entries = %v, want 0", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.Run(ctx); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestPurgeAfterRestart: the purge also removes the modules a previous process left that
// the new one is never asked for, once unused for ModuleExpiry, counting their last use
// before the restart; a module asked for again is kept.
func TestPurgeAfterRestart(t *testing.T) {
	module := wasmtest.Module("purge-restart")
	srv := wasmtest.Start(t, module)
	dir := t.TempDir()
	const expiry = time.Minute
	first, _ := newTestCache(t, Options{Dir: dir, ModuleExpiry: expiry})
	o := GetOptions{Checksum: wasmtest.SHA256(module)}
	used, err := first.Get(t.Context(), srv.HTTP+"/plugin.wasm", o)
	if err != nil {
		t.Fatal(err)
	}
	// Modules the previous process last used 2 minutes ago and 30 seconds ago.
	start := time.Now()
	left := func(name string, lastUse time.Time) string {
		p := filepath.Join(dir, name, strings.Repeat("a", 64)+".wasm")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, module, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, lastUse, lastUse); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale, recent := left("stale", start.Add(-2*time.Minute)), left("recent", start.Add(-30*time.Second))
	// A use of the previous process (a cache hit) counts after the restart too.
	if err := os.Chtimes(used, start.Add(-2*time.Minute), start.Add(-2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if p, err := first.Get(t.Context(), srv.HTTP+"/plugin.wasm", o); err != nil || p != used {
		t.Fatalf("Get = %s, %v, want the cached %s", p, err, used)
	}

	second, _ := newTestCache(t, Options{Dir: dir, ModuleExpiry: expiry})
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	second.purge(start)
	if exists(stale) || exists(filepath.Dir(stale)) {
		t.Errorf("a module unused for 2m, left by the previous process, is still there after the purge (expiry %v)", expiry)
	}
	if !exists(recent) || !exists(used) {
		t.Fatalf("modules used within the expiry were purged: %s %v, %s %v", recent, exists(recent), used, exists(used))
	}
	// The new process is asked for one of them: 45 s later it is kept, the other (unused for
	// 75 s) goes.
	if p, err := second.Get(t.Context(), srv.HTTP+"/plugin.wasm", o); err != nil || p != used {
		t.Fatalf("Get after the restart = %s, %v, want the cached %s", p, err, used)
	}
	second.purge(start.Add(45 * time.Second))
	if exists(recent) {
		t.Error("a module left by the previous process and never asked for again outlived its expiry")
	}
	if !exists(used) {
		t.Error("a module asked for after the restart was purged within its expiry")
	}
}

// value reads a counter or gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// TestUnwritableDir: a cache directory that cannot be created fails the fetch (and so the
// filter falls back), never the cache's creation, which would stop xds-proxy.
func TestUnwritableDir(t *testing.T) {
	srv := wasmtest.Start(t, wasmtest.Module("unwritable"))
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	c, _ := newTestCache(t, Options{Dir: filepath.Join(file, "data")}) // under a regular file
	if p, err := c.Get(t.Context(), srv.HTTP+"/plugin.wasm", GetOptions{}); err == nil {
		t.Fatalf("Get = %s, want an error", p)
	}
}
