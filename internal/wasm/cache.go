package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/hashicorp/go-hclog"

	"github.com/agentd/agentd/internal/memory"
)

const ociPrefix = "oci://"

// Cache keeps fetched modules as files, <dir>/<sha256 of the module name>/<checksum>.wasm as
// Istio lays them out. A file is written under a temporary name and renamed once verified,
// so a process killed during a fetch leaves no partial module; a file found there is trusted
// by the next process (the cache survives a restart), and one fetch serves every client. A
// module's last use is also its file's modification time, so that the purge covers the files
// a previous process left as well, whether or not they are asked for again.
type Cache struct {
	o       Options
	log     hclog.Logger
	metrics *Metrics
	http    *httpFetcher

	mu        sync.Mutex
	modules   map[moduleKey]*entry
	checksums map[string]*checksumEntry // by URL: the last checksum fetched for a tag or an HTTP URL
	// found are the paths of module files a previous process left, not used since the start.
	found map[string]bool
}

// moduleKey names a module without its version (an OCI tag or digest is dropped) and the
// checksum of the version.
type moduleKey struct{ name, checksum string }

type entry struct {
	path string
	last time.Time       // last use, for the purge
	urls map[string]bool // checksum entries that point here, dropped with it
}

type checksumEntry struct {
	checksum string
	versions map[string]string // resource version by resource name, for the pull policy
}

// NewCache returns a cache in o.Dir, removes what a killed process left half-written there
// and takes the modules a previous process left into the purge.
func NewCache(o Options, log hclog.Logger, m *Metrics) (*Cache, error) {
	o = o.withDefaults()
	// Envoy gets absolute paths, as Istio gives them, whatever its working directory.
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("the Wasm cache directory: %w", err)
	}
	o.Dir = dir // created with the first module: a directory that cannot be made fails fetches, not xDS
	leftovers, _ := filepath.Glob(filepath.Join(o.Dir, "*", "*.wasm.tmp*"))
	for _, f := range leftovers {
		_ = os.Remove(f)
	}
	found := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(o.Dir, "*", "*.wasm"))
	for _, f := range files {
		found[f] = true
	}
	return &Cache{
		o: o, log: log, metrics: m, http: newHTTPFetcher(o),
		modules: map[moduleKey]*entry{}, checksums: map[string]*checksumEntry{}, found: found,
	}, nil
}

// moduleName is url without an OCI tag or digest.
func moduleName(u string) string {
	if ref, ok := strings.CutPrefix(u, ociPrefix); ok {
		if r, err := name.ParseReference(ref); err == nil {
			return ociPrefix + r.Context().Name()
		}
	}
	return u
}

// ignoreVersion says whether a cached module is used whatever the resource version.
func ignoreVersion(p PullPolicy, u *url.URL) bool {
	switch p {
	case PullAlways:
		return false
	case PullIfNotPresent:
		return true
	}
	return u.Scheme != "oci" || !strings.HasSuffix(u.Path, ":latest")
}

// isSHA256 reports whether s is a sha256 in lower-case hex, as the cache names files.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

// request is one Get.
type request struct {
	url, resource, version string
	key                    moduleKey
}

// Get returns the local file of the module at rawURL, fetching it when it is not cached.
func (c *Cache) Get(ctx context.Context, rawURL string, o GetOptions) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parsing the module URL: %w", err)
	}
	if o.Checksum != "" && !isSHA256(o.Checksum) {
		return "", fmt.Errorf("checksum %q of %s is not a sha256 in lower-case hex", o.Checksum, rawURL)
	}
	r := request{url: rawURL, resource: o.ResourceName, version: o.ResourceVersion,
		key: moduleKey{name: moduleName(rawURL), checksum: o.Checksum}}
	if e := c.lookup(&r, ignoreVersion(o.PullPolicy, u)); e != "" {
		return e, nil
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = defaultPullTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.fetch(ctx, u, r, o.PullSecret)
}

func (c *Cache) fetch(ctx context.Context, u *url.URL, r request, secret []byte) (string, error) {
	var (
		module []byte
		sum    string
		read   func() ([]byte, error)
	)
	switch u.Scheme {
	case "http", "https":
		b, err := c.http.fetch(ctx, r.url, c.o.insecure(u.Host))
		if err != nil {
			c.fetched(downloadFailure)
			return "", err
		}
		h := sha256.Sum256(b)
		module, sum = b, hex.EncodeToString(h[:])
	case "oci":
		img, err := pullManifest(ctx, u.Host+u.Path, c.o, secret)
		if err != nil {
			c.fetched(manifestFailure)
			return "", err
		}
		sum, read = img.digest, img.module
	default:
		return "", fmt.Errorf("unsupported Wasm module URL scheme %q", u.Scheme)
	}
	if r.key.checksum == "" {
		r.key.checksum = sum
		if p := c.lookup(&r, true); p != "" {
			return p, nil // the manifest told which cached module this is
		}
	} else if r.key.checksum != sum {
		c.fetched(checksumMismatch)
		return "", fmt.Errorf("module %s has checksum %s, want %s", r.url, sum, r.key.checksum)
	}
	if read != nil {
		b, err := read()
		if err != nil {
			c.fetched(downloadFailure)
			return "", fmt.Errorf("reading the module of image %s: %w", r.url, err)
		}
		module = b
	}
	if len(module) >= memory.Large {
		defer memory.Release() // a module is read whole: give the heap back once it is on disk
	}
	if !validWasm(module) {
		c.fetched(invalidBinary)
		return "", fmt.Errorf("module %s is not a Wasm binary", r.url)
	}
	c.fetched(fetchSuccess)
	return c.add(r, module)
}

func (c *Cache) fetched(result string) { c.metrics.remoteFetches.WithLabelValues(result).Inc() }

// lookup finds a cached module, filling r's checksum when it can be known without a fetch
// (an OCI digest reference, or the checksum last fetched for the URL), and returns its path.
func (c *Cache) lookup(r *request, anyVersion bool) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.key.checksum == "" {
		if ref, ok := strings.CutPrefix(r.url, ociPrefix); ok {
			if d, err := name.NewDigest(ref); err == nil {
				r.key.checksum, _ = strings.CutPrefix(d.DigestStr(), "sha256:")
				if strings.Contains(r.key.checksum, ":") {
					r.key.checksum = "" // another algorithm: not cached
				}
			}
		}
	}
	if r.key.checksum == "" {
		if ce := c.checksums[r.url]; ce != nil {
			if anyVersion || ce.versions[r.resource] == r.version {
				r.key.checksum = ce.checksum
			}
			ce.versions[r.resource] = r.version
		}
	}
	e := c.modules[r.key]
	if e == nil && r.key.checksum != "" {
		e = c.adopt(r.key)
	}
	c.metrics.cacheLookups.WithLabelValues(strconv.FormatBool(e != nil)).Inc()
	if e == nil {
		return ""
	}
	e.use()
	c.remember(*r, e)
	return e.path
}

// use records a use of the module, in memory and as its file's modification time for the
// next process.
func (e *entry) use() {
	e.last = time.Now()
	_ = os.Chtimes(e.path, e.last, e.last) // the file is gone: the next fetch writes it again
}

// adopt takes in a module file a previous process verified and wrote.
func (c *Cache) adopt(k moduleKey) *entry {
	p := c.path(k)
	b := make([]byte, 8)
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	if n, _ := f.Read(b); !validWasm(b[:n]) {
		return nil
	}
	e := &entry{path: p, urls: map[string]bool{}}
	delete(c.found, p)
	c.modules[k] = e
	c.metrics.cacheEntries.WithLabelValues().Set(float64(len(c.modules)))
	return e
}

// remember records the checksum of a tag or HTTP URL (a digest reference needs none).
func (c *Cache) remember(r request, e *entry) {
	if strings.HasPrefix(r.url, ociPrefix) && strings.Contains(r.url, "@") {
		return
	}
	ce := c.checksums[r.url]
	if ce == nil {
		ce = &checksumEntry{versions: map[string]string{}}
		c.checksums[r.url] = ce
	}
	ce.checksum = r.key.checksum
	ce.versions[r.resource] = r.version
	e.urls[r.url] = true
}

func (c *Cache) path(k moduleKey) string {
	h := sha256.Sum256([]byte(k.name))
	return filepath.Join(c.o.Dir, hex.EncodeToString(h[:]), k.checksum+".wasm")
}

// add writes a verified module and returns its path.
func (c *Cache) add(r request, module []byte) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.modules[r.key]; e != nil {
		e.use()
		c.remember(r, e)
		return e.path, nil
	}
	p := c.path(r.key)
	if err := writeFile(p, module); err != nil {
		return "", fmt.Errorf("caching module %s: %w", r.url, err)
	}
	e := &entry{path: p, last: time.Now(), urls: map[string]bool{}}
	delete(c.found, p) // written again over a file of a previous process
	c.modules[r.key] = e
	c.remember(r, e)
	c.metrics.cacheEntries.WithLabelValues().Set(float64(len(c.modules)))
	return p, nil
}

// writeFile writes b to p through a temporary file in the same directory, so that p is
// either absent or complete.
func writeFile(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".tmp*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// Run removes modules unused for ModuleExpiry every PurgeInterval until ctx ends: those this
// process used, and those a previous process left that are not asked for again.
func (c *Cache) Run(ctx context.Context) error {
	t := time.NewTicker(c.o.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			c.purge(now)
		}
	}
}

func (c *Cache) purge(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.modules {
		if now.Sub(e.last) <= c.o.ModuleExpiry || !c.remove(e.path) {
			continue
		}
		for u := range e.urls {
			delete(c.checksums, u)
		}
		delete(c.modules, k)
	}
	// A file's last use is read now: another process (a swap's old one) may still use it.
	for p := range c.found {
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			delete(c.found, p) // gone, or not a module this cache wrote
			continue
		}
		if now.Sub(fi.ModTime()) > c.o.ModuleExpiry && c.remove(p) {
			delete(c.found, p)
		}
	}
	c.metrics.cacheEntries.WithLabelValues().Set(float64(len(c.modules)))
}

// remove deletes an expired module file, and its directory once empty.
func (c *Cache) remove(p string) bool {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Error("cannot remove an expired Wasm module", "path", p, "error", err)
		return false
	}
	_ = os.Remove(filepath.Dir(p)) // fails while another version of the module is there
	c.log.Debug("removed an expired Wasm module", "path", p)
	return true
}
