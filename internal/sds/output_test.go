package sds

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOutputCertsRetried: OUTPUT_CERTS cannot be written when the certificate is issued (a file
// stands where its directory goes, as a full or read-only disk would fail it); the failure is
// counted, and the files are written once the way is clear, long before any rotation.
func TestOutputCertsRetried(t *testing.T) {
	tc := startCA(t)
	var s *sdsUnderTest
	o := withCA(t, tc, &s, spiffe("ns1", "sa1"), time.Hour)
	o.OutputDir = filepath.Join(t.TempDir(), "out")
	if err := os.WriteFile(o.OutputDir, []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = startSDS(t, o)
	eventually(t, "a certificate", func() bool { return s.Ready() == nil })
	eventually(t, "the failed write counted", func() bool {
		return s.metric(t, "agentd_output_certs_write_failures_total") >= 1
	})
	if err := os.Remove(o.OutputDir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{outputKey, outputChain, outputRoot} {
		eventually(t, "OUTPUT_CERTS "+name+" written after the failure", func() bool {
			b, err := os.ReadFile(filepath.Join(o.OutputDir, name))
			return err == nil && len(b) > 0
		})
	}
}
