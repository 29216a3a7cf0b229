// Command helper is a test-only agentd helper for the supervisor's tests. What it does wrong
// comes from its file name's suffix, so one build copied under several names gives every case:
//
//	helper          serves: a line protocol on the inherited "echo" socket ("pid", "bus", or echo)
//	helper-crash    exits with status 3 before the handshake (a binary that crashes on start)
//	helper-hang     starts but never becomes ready
//	helper-nodrain  ignores Drain and its context: only SIGKILL stops it
//	helper-v2       speaks the plugin protocol after this build's
//
// With TESTHELPER_WANT_BUS=1 it is ready only once it got a message on the bus topic "test".
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/agentd/agentd/internal/component"
	agentv1 "github.com/agentd/agentd/proto/agent/v1"
)

func main() {
	mode := ""
	if _, m, ok := strings.Cut(filepath.Base(os.Args[0]), "-"); ok {
		mode = m
	}
	switch mode {
	case "crash":
		os.Exit(3)
	case "v2":
		component.ServeVersion(component.ProtocolVersion+1, "helper", newHelper(mode))
	default:
		component.Serve("helper", newHelper(mode))
	}
}

type helper struct {
	env     *component.Env
	mode    string
	wantBus bool
	lastBus atomic.Pointer[string]
}

func newHelper(mode string) component.Factory {
	return func(env *component.Env) (component.Helper, error) {
		return &helper{env: env, mode: mode, wantBus: os.Getenv("TESTHELPER_WANT_BUS") == "1"}, nil
	}
}

func (h *helper) Run(ctx context.Context) error {
	h.env.Log.Warn("serving", "pid", os.Getpid())
	if h.env.HasSocket("echo") {
		l, err := h.env.Listener("echo")
		if err != nil {
			return err
		}
		go h.serveEcho(l)
		defer l.Close()
	}
	go h.env.Bus.Subscribe(ctx, []string{"test"}, func(m *agentv1.BusMessage) {
		var v wrapperspb.StringValue
		if m.GetPayload().UnmarshalTo(&v) == nil {
			s := v.GetValue()
			h.lastBus.Store(&s)
		}
	})
	if h.mode == "nodrain" {
		select {}
	}
	<-ctx.Done()
	return nil
}

func (h *helper) Ready() error {
	if h.mode == "hang" {
		return errors.New("hanging on purpose")
	}
	if h.wantBus && h.lastBus.Load() == nil {
		return errors.New("waiting for the bus")
	}
	return nil
}

func (h *helper) Drain(ctx context.Context) error {
	if h.mode == "nodrain" {
		select {}
	}
	return nil
}

func (h *helper) serveEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				switch line := sc.Text(); line {
				case "pid":
					fmt.Fprintln(c, strconv.Itoa(os.Getpid()))
				case "bus":
					s := ""
					if p := h.lastBus.Load(); p != nil {
						s = *p
					}
					fmt.Fprintln(c, s)
				default:
					fmt.Fprintln(c, line)
				}
			}
		}()
	}
}
