// Package busybox writes a small OCI image (busybox-static from Debian's
// busybox-static package) as an OCI layout tar that `ctr image import`
// accepts: the demo and the integration tests need no registry.
package busybox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Busybox is where Debian's busybox-static package installs its binary.
const Busybox = "/bin/busybox"

var applets = []string{"sh", "ls", "cat", "echo", "sleep", "mount", "ps", "id", "hostname", "env", "uname",
	"df", "touch", "tty", "stty", "head", "od", "tr", "date", "sync", "kill", "wc", "grep", "seq", "true", "false",
	"dd", "rm", "mkdir", "stat", "nc", "ip", "ping", "wget", "pwd", "whoami", "top", "free", "md5sum", "sha256sum"}

var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// Write writes image name (e.g. "cryo.local/busybox:1") with command cmd as
// an OCI layout tar to w.
func Write(w io.Writer, name string, cmd []string) error {
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return fmt.Errorf("read %s (apt-get install busybox-static): %w", Busybox, err)
	}
	var layer bytes.Buffer
	diffID := sha256.New()
	gz := gzip.NewWriter(&layer)
	lt := tar.NewWriter(io.MultiWriter(gz, diffID))
	dir := func(n string, mode int64) {
		_ = lt.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: mode, ModTime: epoch})
	}
	file := func(n string, mode int64, b []byte) {
		_ = lt.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(b)), ModTime: epoch})
		_, _ = lt.Write(b)
	}
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "root", "run", "var", "data"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	file("bin/busybox", 0o755, bb)
	for _, a := range applets {
		_ = lt.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch})
	}
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"))
	file("etc/group", 0o644, []byte("root:x:0:\nnobody:x:65534:\n"))
	if err := lt.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}

	cfg, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: cmd, WorkingDir: "/"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digestT{digestT("sha256:" + hex.EncodeToString(diffID.Sum(nil)))}},
	})
	if err != nil {
		return err
	}
	out := tar.NewWriter(w)
	blob := func(mediaType string, b []byte) ocispec.Descriptor {
		sum := sha256.Sum256(b)
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digestT("sha256:" + hex.EncodeToString(sum[:])), Size: int64(len(b))}
		_ = out.WriteHeader(&tar.Header{Name: "blobs/sha256/" + hex.EncodeToString(sum[:]), Mode: 0o644, Size: d.Size, ModTime: epoch})
		_, _ = out.Write(b)
		return d
	}
	_ = out.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755, ModTime: epoch})
	_ = out.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755, ModTime: epoch})
	layerDesc := blob(ocispec.MediaTypeImageLayerGzip, layer.Bytes())
	cfgDesc := blob(ocispec.MediaTypeImageConfig, cfg)
	m, err := json.Marshal(ocispec.Manifest{
		Versioned: versioned(), MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc, Layers: []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	mDesc := blob(ocispec.MediaTypeImageManifest, m)
	mDesc.Platform = &ocispec.Platform{Architecture: "amd64", OS: "linux"}
	mDesc.Annotations = map[string]string{"io.containerd.image.name": name, ocispec.AnnotationRefName: name}
	idx, err := json.Marshal(ocispec.Index{Versioned: versioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{mDesc}})
	if err != nil {
		return err
	}
	for n, b := range map[string][]byte{"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`), "index.json": idx} {
		_ = out.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: epoch})
		_, _ = out.Write(b)
	}
	return out.Close()
}

// WriteFile writes the image tar to path.
func WriteFile(path, name string, cmd []string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, name, cmd); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
