package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/flock"
	"github.com/cryo-runtime/cryo/internal/qcow2"
	"github.com/cryo-runtime/cryo/vmm"
)

// rootfsDisk turns the rootfs containerd prepared for a container into one
// virtio-blk disk for the guest. QEMU 7.2 cannot migrate virtio-fs or 9p
// while mounted, so every filesystem the guest uses is a block device:
//
//   - blockfile snapshotter: {type: ext4, source: FILE, options: [loop, rw]}:
//     FILE is attached as it is.
//   - overlayfs snapshotter: {type: overlay, options: [lowerdir=..., upperdir=...]}:
//     the read-only lower layers become an ext4 base image, built once per
//     layer chain and cached on the node; the container writes to its own
//     qcow2 overlay on that base (containerd's upperdir stays unused).
//   - no mounts (the client mounted <bundle>/rootfs itself): that directory
//     is the base.
type rootfsBuilder struct {
	cacheDir    string // shared base images
	writableMiB int
}

func (b *rootfsBuilder) disk(ctx context.Context, id, bundle, workDir string, mounts []*types.Mount) (vmm.Disk, error) {
	d := vmm.Disk{ID: DiskID(id), Serial: diskSerial(id)}
	var lowers []string
	switch {
	case len(mounts) == 0:
		lowers = []string{filepath.Join(bundle, "rootfs")}
	case len(mounts) == 1 && mounts[0].Type == "ext4":
		d.Path, d.Format = mounts[0].Source, "raw"
		if slices.Contains(mounts[0].Options, "ro") {
			d.ReadOnly = true
		}
		return d, nil
	case len(mounts) == 1 && mounts[0].Type == "overlay":
		for _, o := range mounts[0].Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				lowers = strings.Split(v, ":")
			}
		}
		if len(lowers) == 0 {
			return d, fmt.Errorf("overlay rootfs of %s has no lowerdir", id)
		}
	case len(mounts) == 1 && mounts[0].Type == "bind":
		lowers = []string{mounts[0].Source}
	default:
		return d, fmt.Errorf("rootfs of %s: unsupported mounts %v (use the overlayfs or blockfile snapshotter)", id, mountTypes(mounts))
	}
	base, err := b.baseImage(ctx, lowers)
	if err != nil {
		return d, err
	}
	overlay := filepath.Join(workDir, d.ID+".qcow2")
	if err := createOverlay(ctx, base, overlay); err != nil {
		return d, fmt.Errorf("create writable overlay for %s: %w", id, err)
	}
	d.Path, d.Format = overlay, "qcow2"
	return d, nil
}

// baseImage returns a cached read-only ext4 image holding the union of the
// lower directories (first one on top, as in overlayfs). Snapshot
// directories of committed layers never change, so their paths key the cache.

func (b *rootfsBuilder) baseImage(ctx context.Context, lowers []string) (string, error) {
	sum := sha256.Sum256([]byte(fmt.Sprintf("v1 %d %s", b.writableMiB, strings.Join(lowers, ":"))))
	key := hex.EncodeToString(sum[:16])
	if err := os.MkdirAll(b.cacheDir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(b.cacheDir, key+".ext4")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	// One builder per key on the node: others wait on the lock.
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	lctx, cancel := context.WithTimeout(ctx, baseImageWait)
	err = flock.Wait(lctx, lock, unix.LOCK_EX)
	cancel()
	if err != nil {
		return "", fmt.Errorf("wait for the base image another shim builds: %w", err)
	}
	defer flock.Unlock(lock) //nolint:errcheck
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}

	start := time.Now()
	src := lowers[0]
	if len(lowers) > 1 {
		mnt, err := os.MkdirTemp(b.cacheDir, ".union-")
		if err != nil {
			return "", err
		}
		defer os.Remove(mnt)
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")); err != nil {
			return "", fmt.Errorf("mount layer union: %w", err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH) //nolint:errcheck
		src = mnt
	}
	used, err := dirSize(src)
	if err != nil {
		return "", fmt.Errorf("size layers: %w", err)
	}
	size := used + used/4 + int64(b.writableMiB)<<20
	tmp := path + ".tmp"
	defer os.Remove(tmp)
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		return "", err
	}
	if err := os.Truncate(tmp, size); err != nil {
		return "", err
	}
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-L", "cryo-root", "-E", "lazy_itable_init=1,lazy_journal_init=1",
		"-d", src, tmp); err != nil {
		return "", fmt.Errorf("build base image from %s: %w", src, err)
	}
	if err := os.Chmod(tmp, 0o400); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	log.G(ctx).WithFields(log.Fields{"image": path, "layers": len(lowers), "bytes": used, "duration": time.Since(start)}).Info("built rootfs base image")
	return path, nil
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += (info.Size() + 4095) &^ 4095
		n += 256 // inode
		return nil
	})
	return n, err
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return fmt.Errorf("%s not found: install it (apt-get install %s)", name, packageOf(name))
		}
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func packageOf(bin string) string {
	switch bin {
	case "qemu-img":
		return "qemu-utils"
	case "mkfs.ext4":
		return "e2fsprogs"
	}
	return bin
}

func mountTypes(ms []*types.Mount) []string {
	var t []string
	for _, m := range ms {
		t = append(t, m.Type)
	}
	return t
}

// DiskID is the QEMU node and device id of a container's root disk.
func DiskID(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "root-" + hex.EncodeToString(sum[:6])
}

// diskSerial is the virtio-blk serial (at most 20 bytes) by which the guest
// agent finds the container's root disk.
func diskSerial(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "cryo" + hex.EncodeToString(sum[:8])
}

// createOverlay makes overlay an empty qcow2 image over the raw image base.
// It writes the image itself; a base whose size qcow2 cannot describe
// exactly (not a multiple of 512 bytes) goes to qemu-img, which rounds.
func createOverlay(ctx context.Context, base, overlay string) error {
	st, err := os.Stat(base)
	if err != nil {
		return err
	}
	if st.Size() > 0 && st.Size()%512 == 0 {
		return qcow2.CreateOverlay(overlay, base, st.Size())
	}
	return run(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay)
}
