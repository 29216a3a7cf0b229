package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
)

// serveAdmin serves the admin API on the bootstrap's admin address.
func (s *server) serveAdmin(ctx context.Context, wg *sync.WaitGroup) (*http.Server, error) {
	a := s.bootstrap.GetAdmin().GetAddress().GetSocketAddress()
	if a == nil {
		return nil, fmt.Errorf("admin address must be a socket address")
	}
	l, err := listenTCP(a)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", s.handleReady)
	mux.HandleFunc("/stats", s.handleStats)
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		s.stats.writePrometheus(w)
	})
	mux.HandleFunc("/drain_listeners", post(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		s.drain(q.Has("inboundonly"), q.Has("skip_exit"))
		fmt.Fprintln(w, "OK")
	}))
	mux.HandleFunc("/quitquitquit", post(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "OK")
		logf("info", "admin", "quitquitquit: shutting down")
		s.shutdown()
	}))
	mux.HandleFunc("/server_info", s.handleServerInfo)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.stats.add("listener.admin.downstream_cx_active", 1)
				s.stats.add("listener.admin.main_thread.downstream_cx_active", 1)
			case http.StateClosed, http.StateHijacked:
				s.stats.add("listener.admin.downstream_cx_active", -1)
				s.stats.add("listener.admin.main_thread.downstream_cx_active", -1)
			}
		},
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv.Serve(l)
	}()
	logf("info", "admin", "admin address: %s", l.Addr())
	return srv, nil
}

// post allows only POST, as Envoy does for mutating admin endpoints.
func post(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "This endpoint requires POST", http.StatusMethodNotAllowed)
			return
		}
		h(w, r)
	}
}

func stateName(st uint64) string {
	return map[uint64]string{stateLive: "LIVE", stateDraining: "DRAINING", statePreInitializing: "PRE_INITIALIZING", stateInitializing: "INITIALIZING"}[st]
}

func (s *server) handleReady(w http.ResponseWriter, r *http.Request) {
	st := s.stats.get("server.state")
	if st != stateLive {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintln(w, stateName(st))
}

// handleStats is /stats?usedonly&filter=<regex>; the stand-in only has used stats.
func (s *server) handleStats(w http.ResponseWriter, r *http.Request) {
	var re *regexp.Regexp
	if f := r.URL.Query().Get("filter"); f != "" {
		var err error
		if re, err = regexp.Compile(f); err != nil {
			http.Error(w, "Invalid re2 regex", http.StatusBadRequest)
			return
		}
	}
	if r.URL.Query().Get("format") == "prometheus" {
		s.stats.writePrometheus(w)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	s.stats.writeText(w, re)
}

func (s *server) handleServerInfo(w http.ResponseWriter, r *http.Request) {
	o := s.opts
	info := &adminv3.ServerInfo{
		Version:            "envoy-standin/0.0.0/test-stand-in-not-envoy",
		State:              adminv3.ServerInfo_State(s.stats.get("server.state")),
		UptimeCurrentEpoch: durationpb.New(time.Since(s.started)),
		UptimeAllEpochs:    durationpb.New(time.Since(s.started)),
		HotRestartVersion:  "disabled",
		CommandLineOptions: &adminv3.CommandLineOptions{
			ConfigPath:        o.configPath,
			ConfigYaml:        o.configYAML,
			Concurrency:       uint32(o.concurrency),
			DrainTime:         durationpb.New(time.Duration(o.drainTimeS) * time.Second),
			LogLevel:          o.logLevel,
			ComponentLogLevel: o.componentLogLevel,
			DisableHotRestart: true,
		},
		Node: s.bootstrap.GetNode(),
	}
	if o.drainStrategy == "immediate" {
		info.CommandLineOptions.DrainStrategy = adminv3.CommandLineOptions_Immediate
	}
	if o.ipVersion == "v6" {
		info.CommandLineOptions.LocalAddressIpVersion = adminv3.CommandLineOptions_v6
	}
	js, err := protojson.MarshalOptions{UseProtoNames: true, Indent: " "}.Marshal(info)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(js)
}
