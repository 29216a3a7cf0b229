// Package repo checks the repository itself: generated code matches its sources, and every
// package says what it is.
package repo

import (
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const top = "../.."

// TestGeneratedProtoIsCurrent regenerates proto/ into a temp dir with scripts/gen-proto.sh
// (pinned generators) and compares it with the committed code.
func TestGeneratedProtoIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Fatal("protoc is not installed (apt-get install protobuf-compiler); .ci/run installs it")
	}
	out := t.TempDir()
	cmd := exec.Command("scripts/gen-proto.sh", out)
	cmd.Dir = top
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/gen-proto.sh: %v\n%s", err, b)
	}
	generated := 0
	err := filepath.WalkDir(filepath.Join(top, "proto"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".pb.go") {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join(top, "proto"), path)
		committed, _ := os.ReadFile(path)
		fresh, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Errorf("%s is committed but not generated from any .proto", rel)
			return nil
		}
		generated++
		if !bytes.Equal(committed, fresh) {
			t.Errorf("proto/%s differs from what scripts/gen-proto.sh generates: run it and commit", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(out, path)
			if _, err := os.Stat(filepath.Join(top, "proto", rel)); err != nil {
				t.Errorf("proto/%s is generated but not committed", rel)
			}
		}
		return nil
	})
	if generated == 0 {
		t.Fatal("no generated code found under proto/")
	}
}

// TestEveryPackageHasADoc: every package under cmd/, internal/ and test/ has a doc comment.
func TestEveryPackageHasADoc(t *testing.T) {
	for _, dir := range []string{"cmd", "internal", "test", "proto"} {
		filepath.WalkDir(filepath.Join(top, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" && path != filepath.Join(top, dir) {
				return nil // test programs there are packages too: check them
			}
			pkgs, err := parser.ParseDir(token.NewFileSet(), path, func(fi fs.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("parse %s: %v", path, err)
				return nil
			}
			for name, pkg := range pkgs {
				hasDoc := false
				for _, f := range pkg.Files {
					hasDoc = hasDoc || f.Doc != nil
				}
				if !hasDoc {
					t.Errorf("package %s in %s has no doc comment", name, path)
				}
			}
			return nil
		})
	}
}
