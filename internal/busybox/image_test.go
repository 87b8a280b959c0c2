package busybox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// readImage returns the layer's entries by name and the image config of an
// OCI layout tar with one manifest of one layer.
func readImage(t *testing.T, b []byte) (map[string]*tar.Header, map[string][]byte, ocispec.Image) {
	t.Helper()
	blobs := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		blobs[h.Name] = body
	}
	var idx ocispec.Index
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	blob := func(d ocispec.Descriptor) []byte { return blobs["blobs/sha256/"+d.Digest.Encoded()] }
	var m ocispec.Manifest
	if err := json.Unmarshal(blob(idx.Manifests[0]), &m); err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(blob(m.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	headers, contents := map[string]*tar.Header{}, map[string][]byte{}
	lr := tar.NewReader(gz)
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if headers[h.Name] != nil {
			t.Errorf("layer has %s twice", h.Name)
		}
		headers[h.Name] = h
		contents[h.Name], _ = io.ReadAll(lr)
	}
	return headers, contents, cfg
}

func TestWriteSpecBare(t *testing.T) {
	var b bytes.Buffer
	err := WriteSpec(&b, Spec{Name: "x.local/pause:1", Cmd: []string{"/pause"}, Bare: true,
		Files: []File{{Path: "pause", Mode: 0o755, Content: "ELF"}}})
	if err != nil {
		t.Fatal(err)
	}
	headers, contents, cfg := readImage(t, b.Bytes())
	if len(headers) != 1 || string(contents["pause"]) != "ELF" || headers["pause"].Mode != 0o755 {
		t.Fatalf("bare layer = %v, want only pause", headers)
	}
	if got := strings.Join(cfg.Config.Cmd, " "); got != "/pause" {
		t.Fatalf("cmd = %q", got)
	}
}

func TestWriteSpecFilesVolumesLinks(t *testing.T) {
	if _, err := os.Stat(Busybox); err != nil {
		t.Skipf("%s: %v", Busybox, err)
	}
	var b bytes.Buffer
	err := WriteSpec(&b, Spec{Name: "x.local/vol:1", Cmd: []string{"sh"}, AllApplets: true, LinkTarget: "/bin/busybox",
		Volumes: []string{"/test_dir"},
		Files: []File{
			{Path: "etc/group", Mode: 0o644, Content: "wheel:x:10:root\n"},
			{Path: "test_dir", Mode: 0o755, Dir: true, UID: 65534, GID: 65534},
			{Path: "test_dir/f", Mode: 0o600, Content: "c"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	headers, contents, cfg := readImage(t, b.Bytes())
	if got := string(contents["etc/group"]); got != "wheel:x:10:root\n" {
		t.Errorf("etc/group = %q: the spec's file must replace the default", got)
	}
	if h := headers["test_dir/"]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != 65534 || h.Gid != 65534 {
		t.Errorf("test_dir/ = %+v, want a directory owned by 65534:65534", h)
	}
	if string(contents["test_dir/f"]) != "c" {
		t.Errorf("test_dir/f missing")
	}
	if h := headers["bin/tail"]; h == nil || h.Linkname != "/bin/busybox" {
		t.Errorf("bin/tail = %+v, want a link to /bin/busybox (AllApplets, LinkTarget)", h)
	}
	if _, ok := cfg.Config.Volumes["/test_dir"]; !ok || len(cfg.Config.Volumes) != 1 {
		t.Errorf("volumes = %v", cfg.Config.Volumes)
	}
}

func TestWriteUnchanged(t *testing.T) {
	if _, err := os.Stat(Busybox); err != nil {
		t.Skipf("%s: %v", Busybox, err)
	}
	var b bytes.Buffer
	if err := Write(&b, "x.local/busybox:1", []string{"sh"}); err != nil {
		t.Fatal(err)
	}
	headers, _, cfg := readImage(t, b.Bytes())
	if h := headers["bin/sh"]; h == nil || h.Linkname != "busybox" {
		t.Errorf("bin/sh = %+v, want a relative link to busybox", h)
	}
	if headers["bin/tail"] != nil {
		t.Errorf("the plain image links only the project's applets")
	}
	if cfg.Config.Volumes != nil {
		t.Errorf("volumes = %v, want none", cfg.Config.Volumes)
	}
}

func TestWriteSpecEntrypointUser(t *testing.T) {
	var b bytes.Buffer
	err := WriteSpec(&b, Spec{Name: "x.local/prog:1", Bare: true, Entrypoint: []string{"/prog"}, Cmd: []string{"--flag"}, User: "65532:65532",
		Files: []File{{Path: "prog", Mode: 0o755, Content: "ELF"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, cfg := readImage(t, b.Bytes())
	if strings.Join(cfg.Config.Entrypoint, " ") != "/prog" || strings.Join(cfg.Config.Cmd, " ") != "--flag" || cfg.Config.User != "65532:65532" {
		t.Fatalf("config = %+v, want entrypoint /prog, cmd --flag, user 65532:65532", cfg.Config)
	}
}

// TestE2BTemplate: the SDK's /bin/bash is a shell (a script that execs
// busybox's sh), and E2B's user "user" exists with its home.
func TestE2BTemplate(t *testing.T) {
	if _, err := os.Stat(Busybox); err != nil {
		t.Skipf("%s: %v", Busybox, err)
	}
	var b bytes.Buffer
	if err := WriteSpec(&b, E2BTemplate("x.local/e2b:1", []string{"sleep", "inf"})); err != nil {
		t.Fatal(err)
	}
	headers, contents, cfg := readImage(t, b.Bytes())
	if h := headers["bin/bash"]; h == nil || h.Mode&0o111 == 0 || !strings.HasPrefix(string(contents["bin/bash"]), "#!/bin/sh\n") {
		t.Errorf("bin/bash = %+v %q, want an executable script run by /bin/sh", h, contents["bin/bash"])
	}
	if !strings.Contains(string(contents["etc/passwd"]), "\nuser:x:1000:1000:user:/home/user:") {
		t.Errorf("etc/passwd = %q, want E2B's user", contents["etc/passwd"])
	}
	if h := headers["home/user/"]; h == nil || h.Uid != 1000 {
		t.Errorf("home/user/ = %+v, want a directory owned by user", h)
	}
	if strings.Join(cfg.Config.Cmd, " ") != "sleep inf" || headers["bin/sh"] == nil {
		t.Errorf("cmd %v, bin/sh %v", cfg.Config.Cmd, headers["bin/sh"])
	}
}
