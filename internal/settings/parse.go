package settings

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/caarlos0/env/v11"
	"github.com/hashicorp/go-hclog"
)

// parseEnv parses the Env table from environ. A value that does not parse is handled as
// Istio's agent handles it (the row's bad tag): refused with an error, or logged and replaced
// by Istio's default.
func parseEnv(environ []string, log hclog.Logger) (Env, error) {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var out Env
	err := env.ParseWithOptions(&out, env.Options{Environment: vars})
	if err == nil {
		return out, nil
	}
	var refused []error
	for _, e := range unwrap(err) {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			return Env{}, fmt.Errorf("environment: %w", e)
		}
		row, ok := RowOf(pe.Name)
		if !ok {
			return Env{}, fmt.Errorf("environment: %w", e)
		}
		if row.Bad == Refuse {
			refused = append(refused, fmt.Errorf("%s=%q: %w", row.Name, vars[row.Name], pe.Err))
			continue
		}
		log.Warn("invalid environment variable, using Istio's default, as Istio's agent does",
			"name", row.Name, "value", vars[row.Name], "default", row.Default, "error", pe.Err)
		delete(vars, row.Name)
	}
	if len(refused) > 0 {
		return Env{}, errors.Join(refused...)
	}
	out = Env{}
	if err := env.ParseWithOptions(&out, env.Options{Environment: vars}); err != nil {
		return Env{}, fmt.Errorf("environment: %w", err)
	}
	return out, nil
}

func unwrap(err error) []error {
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		return u.Unwrap()
	}
	return []error{err}
}

// Bad is Istio's behaviour on a value that does not parse.
type Bad string

const (
	Warn   Bad = "warn"   // log a warning, use the default (Istio's env package)
	Refuse Bad = "refuse" // stop with an error
)

// Row is one variable of the Env table.
type Row struct {
	Field   string   // the Env field
	Name    string   // the variable
	Default string   // Istio's default
	To      []string // the processes whose configuration it changes
	Bad     Bad
	Type    reflect.Type // its parsed type (string, bool, Duration, Count, Port, Ratio)
}

// Rows is the Env table, in its order.
func Rows() []Row {
	t := reflect.TypeFor[Env]()
	rows := make([]Row, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		rows = append(rows, Row{
			Field: f.Name, Name: f.Tag.Get("env"), Default: f.Tag.Get("envDefault"),
			To: strings.Split(f.Tag.Get("to"), ","), Bad: Bad(f.Tag.Get("bad")), Type: f.Type,
		})
	}
	return rows
}

// RowOf is the row of an Env field.
func RowOf(field string) (Row, bool) {
	for _, r := range Rows() {
		if r.Field == field {
			return r, true
		}
	}
	return Row{}, false
}
