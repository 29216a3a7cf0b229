package sds

import (
	"strings"
	"testing"

	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func TestValidate(t *testing.T) {
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
			err := Validate(tt.c)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate(%v) = %v, want an error containing %q (none when empty)", tt.c, err, tt.want)
			}
		})
	}
}
