package sds

import (
	"strings"
	"testing"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

// TestConfigFromRefuses: what sds-server cannot run with is refused at Configure (agentd's
// settings table refuses or replaces it first, at agentd's start).
func TestConfigFromRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    *agentv1.SDSConfig
		want string // "" for valid
	}{
		{"defaults", &agentv1.SDSConfig{}, ""},
		{"ecdsa p384", &agentv1.SDSConfig{EccSignatureAlgorithm: "ECDSA", EccCurve: "P384"}, ""},
		{"unknown curve", &agentv1.SDSConfig{EccSignatureAlgorithm: "ECDSA", EccCurve: "P999"}, "curve"},
		{"unknown algorithm", &agentv1.SDSConfig{EccSignatureAlgorithm: "ED25519"}, "algorithm"},
		{"grace ratio above 1", &agentv1.SDSConfig{GracePeriodRatio: 1.5}, "SECRET_GRACE_PERIOD_RATIO"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := configFrom(tt.c, "")
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("configFrom(%v) = %v, want an error containing %q (none when empty)", tt.c, err, tt.want)
			}
		})
	}
}
