package sds

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/agentd/agentd/internal/memory"

	"github.com/hashicorp/go-hclog"

	"github.com/agentd/agentd/internal/caclient"
)

// Signer has a CSR signed by a CA; *caclient.Client is one.
type Signer interface {
	Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) ([]string, error)
}

// Backoff of the manager's retries while the CA fails.
const (
	retryInitial = 500 * time.Millisecond
	retryMax     = 30 * time.Second
	signTimeout  = 30 * time.Second
)

// workload is one issued workload certificate.
type workload struct {
	chain, key []byte // PEM
	root       []byte // the CA's root (the answer's last certificate)
	created    time.Time
	expire     time.Time
	rotateAt   time.Time
}

// manager keeps the workload certificate from the CA: it asks for one at start, rotates it
// before it expires, keeps serving the cached one while the CA fails, and writes the
// OUTPUT_CERTS files.
type manager struct {
	ca          Signer
	identity    string
	key         caclient.KeyOptions
	ttl         time.Duration
	graceRatio  float64
	graceJitter float64
	out         *output
	log         hclog.Logger
	m           *metrics
	notify      func(name string)

	renewNow chan struct{}
	first    chan struct{} // closed once a certificate exists
	once     sync.Once

	mu     sync.RWMutex
	cur    *workload
	bundle []byte // PCDS trust bundle
}

// Run keeps a valid certificate until ctx ends.
func (m *manager) Run(ctx context.Context) error {
	retried := make(chan struct{})
	go func() { defer close(retried); m.out.run(ctx, m.log) }()
	defer func() { <-retried }()
	wait := retryInitial
	forced := false
	for {
		cur := m.current()
		var next time.Duration
		if cur == nil || forced || !time.Now().Before(cur.rotateAt) {
			err := m.renew(ctx)
			if err == nil {
				wait, forced = retryInitial, false
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			next = retryDelay(wait, cur)
			wait = min(2*wait, retryMax)
			if cur != nil {
				m.log.Warn("workload certificate renewal failed; serving the cached one", "error", err, "expires", cur.expire, "retry_in", next)
			} else {
				m.log.Warn("workload certificate request failed", "error", err, "retry_in", next)
			}
		} else {
			next = time.Until(cur.rotateAt)
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-m.renewNow:
			t.Stop()
			forced = true
		}
	}
}

// retryDelay is the wait before the next try: the backoff, but no more than a quarter of
// what is left of the cached certificate's life, so a short-lived one is renewed in time.
func retryDelay(backoff time.Duration, cur *workload) time.Duration {
	if cur != nil {
		if left := time.Until(cur.expire) / 4; left > 0 && left < backoff {
			return max(left, 50*time.Millisecond)
		}
	}
	return backoff
}

// renew makes a key and CSR, has it signed and checks the answer; on success the new
// certificate replaces the cached one and is pushed.
func (m *manager) renew(ctx context.Context) error {
	csr, keyPEM, key, err := caclient.NewCSR(m.key, m.identity)
	if err != nil {
		return err
	}
	m.m.outgoingRequests.WithLabelValues(requestTypeCSR).Inc()
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, signTimeout)
	chain, err := m.ca.Sign(sctx, csr, m.ttl)
	cancel()
	m.m.outgoingLatency.WithLabelValues(requestTypeCSR).Add(float64(time.Since(start)) / float64(time.Millisecond))
	var leaf *x509.Certificate
	if err == nil {
		leaf, err = caclient.Verify(chain, key.Public(), time.Now())
	}
	if err != nil {
		m.m.failedRequests.WithLabelValues(requestTypeCSR).Inc()
		return err
	}
	now := time.Now()
	w := &workload{
		chain:   concatChain(chain),
		key:     keyPEM,
		root:    normalizeRoots([]byte(chain[len(chain)-1])),
		created: now,
		expire:  leaf.NotAfter,
	}
	w.rotateAt = rotateAt(w.created, w.expire, m.graceRatio, m.graceJitter, 2*rand.Float64()-1) // #nosec G404 -- jitter only
	m.mu.Lock()
	old := m.cur
	m.cur = w
	bundle := m.bundle
	m.mu.Unlock()
	m.once.Do(func() { close(m.first) })
	m.log.Info("workload certificate issued", "identity", m.identity, "expires", w.expire, "rotate_at", w.rotateAt)
	rootChanged := old == nil || !bytes.Equal(old.root, w.root)
	if err := m.out.write(w.chain, w.key, mergeRoots(w.root, bundle)); err != nil {
		m.log.Error("writing OUTPUT_CERTS failed; trying again", "error", err)
	}
	m.notify(ResourceDefault)
	if rootChanged {
		m.notify(ResourceRootCA)
	}
	// A key's generation leaves MB of big numbers, on two Ps (caclient.withSpareP): given
	// back, sds-server idles 0.5 MB smaller (docs/footprint.md). Once a day.
	memory.Release()
	return nil
}

// rotateAt is Istio's rotation time: expire - lifetime * (ratio + jitter*u), with u uniform
// in [-1, 1) and the ratio clamped to [0, 1].
func rotateAt(created, expire time.Time, ratio, jitter, u float64) time.Time {
	r := min(max(ratio+jitter*u, 0), 1)
	return expire.Add(-time.Duration(r * float64(expire.Sub(created))))
}

func (m *manager) current() *workload {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cur
}

// errExpired is returned while the only certificate there is has expired.
var errExpired = errors.New("workload certificate expired and the CA has not issued a new one")

// workload waits for a certificate until ctx ends and returns it unless it has expired.
func (m *manager) workload(ctx context.Context) (*workload, error) {
	select {
	case <-m.first:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the first workload certificate: %w", ctx.Err())
	}
	w := m.current()
	if !time.Now().Before(w.expire) {
		return nil, fmt.Errorf("%w (at %s)", errExpired, w.expire.UTC().Format(time.RFC3339))
	}
	return w, nil
}

// roots is ROOTCA: the CA's root merged with the PCDS trust bundle.
func (m *manager) roots(ctx context.Context) ([]byte, error) {
	if _, err := m.workload(ctx); err != nil && !errors.Is(err, errExpired) {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return mergeRoots(m.cur.root, m.bundle), nil
}

func (m *manager) expiry() time.Time {
	if w := m.current(); w != nil {
		return w.expire
	}
	return time.Time{}
}

// setTrustBundle replaces the PCDS trust bundle. A change pushes ROOTCA and, as Istio does,
// has the workload certificate re-issued.
func (m *manager) setTrustBundle(b []byte) {
	m.mu.Lock()
	changed := !bytes.Equal(m.bundle, b)
	m.bundle = b
	m.mu.Unlock()
	if !changed {
		return
	}
	m.notify(ResourceRootCA)
	select {
	case m.renewNow <- struct{}{}:
	default:
	}
}

func (m *manager) trustBundle() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bundle
}
