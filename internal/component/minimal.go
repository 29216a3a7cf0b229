package component

import "context"

// Minimal builds a helper that serves the plugin contract and nothing else: ready at once,
// no sockets used, no metrics. A helper binary uses it until its real function lands.
func Minimal(*Env) (Helper, error) { return minimal{}, nil }

type minimal struct{}

func (minimal) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (minimal) Ready() error                  { return nil }
