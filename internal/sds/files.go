package sds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
)

// watcher watches the files that file-served resources are read from and reloads a resource
// when one of its files may have changed. It watches directories rather than files: the
// directory of each path, the directory of its symlink target, and the parent of a
// symlinked directory. That way an in-place write, a file replaced by rename, a re-pointed
// symlink and the kubelet's atomic "..data" swap are all seen, on every rotation, and a
// removed target cannot make the watch go quiet (Istio's issue 59912).
type watcher struct {
	debounce time.Duration
	retryFor time.Duration // how long a reload that fails (half-written pair) is retried
	reload   func(name string) error
	log      hclog.Logger
	m        *metrics

	mu    sync.Mutex
	fs    *fsnotify.Watcher   // nil until Run
	files map[string][]string // resource → paths
	dirs  map[string]bool     // directories watched (true) or to retry (false)
}

func newWatcher(debounce, retryFor time.Duration, reload func(string) error, log hclog.Logger, m *metrics) *watcher {
	return &watcher{
		debounce: debounce, retryFor: retryFor, reload: reload, log: log, m: m,
		files: map[string][]string{}, dirs: map[string]bool{},
	}
}

// add watches the files of resource name.
func (w *watcher) add(name string, paths ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.files[name] = paths
	w.watchLocked(paths)
}

// watchLocked adds a watch on every directory paths depend on; failures are retried by Run.
func (w *watcher) watchLocked(paths []string) {
	for _, p := range paths {
		for _, d := range watchDirs(p) {
			if w.dirs[d] {
				continue
			}
			w.dirs[d] = false
			if w.fs == nil {
				continue
			}
			if err := w.fs.Add(d); err != nil {
				w.m.fileWatcherFailures.WithLabelValues().Inc()
				w.log.Warn("watching certificate directory failed; retrying", "dir", d, "error", err)
				continue
			}
			w.dirs[d] = true
		}
	}
}

// watchDirs are the directories whose events can mean path changed.
func watchDirs(path string) []string {
	dir := filepath.Dir(path)
	dirs := []string{dir}
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		dirs = append(dirs, filepath.Dir(resolved))
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		dirs = append(dirs, filepath.Dir(dir))
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// affected returns the resources an event on path may concern.
func (w *watcher) affected(path string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for name, paths := range w.files {
		for _, p := range paths {
			dirs := watchDirs(p)
			if slices.Contains(dirs, filepath.Dir(path)) || slices.Contains(dirs, path) {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

type retry struct {
	deadline time.Time
	delay    time.Duration
}

// Run watches until ctx ends.
func (w *watcher) Run(ctx context.Context) error {
	fs, err := fsnotify.NewWatcher()
	if err != nil {
		w.m.fileWatcherFailures.WithLabelValues().Inc()
		return fmt.Errorf("create file watcher: %w", err)
	}
	defer fs.Close()
	w.mu.Lock()
	w.fs = fs
	w.retryDirsLocked()
	w.mu.Unlock()

	due := map[string]time.Time{} // resources to reload, and when
	retries := map[string]*retry{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		timer.Reset(untilFirst(due))
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fs.Events:
			if !ok {
				return nil
			}
			w.forgetRemovedDir(ev)
			for _, name := range w.affected(ev.Name) {
				w.log.Debug("certificate file event", "file", ev.Name, "op", ev.Op.String(), "resource", name)
				due[name] = time.Now().Add(w.debounce)
				delete(retries, name) // a new write starts a new retry window
			}
		case err, ok := <-fs.Errors:
			if !ok {
				return nil
			}
			w.m.fileWatcherFailures.WithLabelValues().Inc()
			w.log.Warn("certificate file watch error", "error", err)
		case <-tick.C:
			w.mu.Lock()
			w.retryDirsLocked()
			w.mu.Unlock()
		case <-timer.C:
			w.reloadDue(due, retries)
		}
	}
}

// reloadDue reloads the resources that are due. A failing reload is retried with backoff
// for retryFor, then given up on: the old secret stays served.
func (w *watcher) reloadDue(due map[string]time.Time, retries map[string]*retry) {
	now := time.Now()
	for name, at := range due {
		if at.After(now) {
			continue
		}
		delete(due, name)
		w.mu.Lock()
		paths, ok := w.files[name]
		if ok {
			w.watchLocked(paths) // symlinks may point elsewhere now
		}
		w.mu.Unlock()
		if !ok {
			continue
		}
		err := w.reload(name)
		if err == nil {
			delete(retries, name)
			continue
		}
		r := retries[name]
		if r == nil {
			r = &retry{deadline: now.Add(w.retryFor), delay: w.debounce}
			retries[name] = r
		}
		if now.Add(r.delay).After(r.deadline) {
			delete(retries, name)
			w.m.fileSecretFailures.WithLabelValues().Inc()
			w.log.Error("certificate files did not become valid; keeping the served secret", "resource", name, "error", err)
			continue
		}
		due[name] = now.Add(r.delay)
		r.delay *= 2
	}
}

// forgetRemovedDir marks a watched directory that went away (the kubelet deletes the old
// timestamped directory) as to be watched again if it comes back.
func (w *watcher) forgetRemovedDir(ev fsnotify.Event) {
	if !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.dirs[ev.Name]; ok {
		_ = w.fs.Remove(ev.Name)
		w.dirs[ev.Name] = false
	}
}

func (w *watcher) retryDirsLocked() {
	for d, ok := range w.dirs {
		if ok {
			continue
		}
		if err := w.fs.Add(d); err != nil {
			continue
		}
		w.dirs[d] = true
	}
}

func untilFirst(due map[string]time.Time) time.Duration {
	d := time.Hour
	for _, at := range due {
		d = min(d, max(time.Until(at), 0))
	}
	return d
}
