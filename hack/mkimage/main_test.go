package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProgramSpec(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "cryo-controller")
	if err := os.WriteFile(bin, []byte("\x7fELF-program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := programSpec(bin, "cryo.dev/cryo-controller:dev", []string{"--leader-elect"})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Bare || strings.Join(s.Entrypoint, " ") != "/cryo-controller" || strings.Join(s.Cmd, " ") != "--leader-elect" || s.User != nonRoot {
		t.Fatalf("spec = %+v", s)
	}
	if s.Files[0].Path != "cryo-controller" || s.Files[0].Content != "\x7fELF-program" || s.Files[0].Mode != 0o755 {
		t.Fatalf("binary entry = %+v", s.Files[0])
	}

	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := programSpec(script, "x", nil); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Fatalf("a script: %v, want an error saying it is not an ELF binary", err)
	}
}
