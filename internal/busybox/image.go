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
	"os/exec"
	"strings"
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
	return WriteSpec(w, Spec{Name: name, Cmd: cmd})
}

// Spec describes an image beyond the plain busybox one: test suites written
// for public images (containerd's CRI integration tests) expect their files,
// volumes and applets.
type Spec struct {
	Name string
	Cmd  []string
	// Entrypoint and User are the image config's (a Go program's image:
	// its binary, and a user that is not root).
	Entrypoint []string
	User       string
	// Files are added to the layer after the busybox files (and replace
	// one of the same path).
	Files []File
	// Volumes are the image config's volumes (paths in the container).
	Volumes []string
	// AllApplets links every applet the host's busybox has, not only the
	// few the project's tests use.
	AllApplets bool
	// Bare leaves busybox out: the layer holds only Files.
	Bare bool
	// LinkTarget is what the applet symlinks point to: "busybox" (the
	// default) or "/bin/busybox", as in Alpine, where a symlink followed
	// inside an image volume escapes it.
	LinkTarget string
}

// File is a file, directory (Dir) or symlink (Link) in a Spec's layer.
type File struct {
	Path     string // relative to the root, e.g. "etc/os-release"
	Mode     int64
	UID, GID int
	Content  string
	Dir      bool
	Link     string
}

// WriteSpec writes the image spec describes as an OCI layout tar to w.
func WriteSpec(w io.Writer, spec Spec) error {
	name, cmd := spec.Name, spec.Cmd
	var bb []byte
	var err error
	if !spec.Bare {
		if bb, err = os.ReadFile(Busybox); err != nil {
			return fmt.Errorf("read %s (apt-get install busybox-static): %w", Busybox, err)
		}
	}
	links := applets
	if spec.AllApplets {
		if links, err = hostApplets(); err != nil {
			return err
		}
	}
	target := spec.LinkTarget
	if target == "" {
		target = "busybox"
	}
	var layer bytes.Buffer
	diffID := sha256.New()
	gz := gzip.NewWriter(&layer)
	lt := tar.NewWriter(io.MultiWriter(gz, diffID))
	// A spec's file replaces the default of the same path: one entry per
	// path keeps the layer plain.
	replaced := map[string]bool{}
	for _, f := range spec.Files {
		replaced[f.Path] = true
		replaced[f.Path+"/"] = true
	}
	write := func(h *tar.Header, b []byte) {
		h.ModTime = epoch
		h.Size = int64(len(b))
		_ = lt.WriteHeader(h)
		_, _ = lt.Write(b)
	}
	entry := func(h *tar.Header, b []byte) {
		if !replaced[h.Name] {
			write(h, b)
		}
	}
	dir := func(n string, mode int64) {
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: mode}, nil)
	}
	file := func(n string, mode int64, b []byte) {
		entry(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode}, b)
	}
	if !spec.Bare {
		for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "root", "run", "var", "data"} {
			dir(d, 0o755)
		}
		dir("tmp", 0o1777)
		file("bin/busybox", 0o755, bb)
		for _, a := range links {
			entry(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: target, Mode: 0o777}, nil)
		}
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"))
		file("etc/group", 0o644, []byte("root:x:0:\nnobody:x:65534:\n"))
	}
	for _, f := range spec.Files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: f.Mode, Uid: f.UID, Gid: f.GID}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		}
		var body []byte
		if h.Typeflag == tar.TypeReg {
			body = []byte(f.Content)
		}
		write(h, body)
	}
	if err := lt.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}

	volumes := map[string]struct{}{}
	for _, v := range spec.Volumes {
		volumes[v] = struct{}{}
	}
	if len(volumes) == 0 {
		volumes = nil
	}
	cfg, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config: ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Entrypoint: spec.Entrypoint, Cmd: cmd, User: spec.User,
			WorkingDir: "/", Volumes: volumes},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digestT{digestT("sha256:" + hex.EncodeToString(diffID.Sum(nil)))}},
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
	return WriteSpecFile(path, Spec{Name: name, Cmd: cmd})
}

// WriteSpecFile writes the image tar of spec to path.
func WriteSpecFile(path string, spec Spec) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteSpec(f, spec); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// hostApplets lists the applets of the host's busybox (busybox --list),
// except busybox itself.
func hostApplets() ([]string, error) {
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", Busybox, err)
	}
	var list []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			list = append(list, a)
		}
	}
	return list, nil
}
