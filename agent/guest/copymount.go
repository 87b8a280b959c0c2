package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// bindRemountFlags are the per-mount flags a bind mount's remount sets.
const bindRemountFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
	unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME | unix.MS_STRICTATIME

// copyStage is a tmpfs outside the container's root that holds the content
// of its read-only copied mounts, each bind-mounted from there. What the
// container may not write is in no writable layer, and a secret never
// reaches its disk. The bind mounts keep the tmpfs alive once its own mount
// is released. Read-write copies are written into the root at their target
// and bound onto themselves instead: they may grow, as on the host.
type copyStage struct{ dir string }

// stageCopies mounts the stage, if any copied mount is read-only, and
// writes their content in it, mount i at path(i).
func stageCopies(mounts []mountEntry) (*copyStage, error) {
	st := &copyStage{}
	for i, m := range mounts {
		if m.Copy == nil || m.Flags&unix.MS_RDONLY == 0 {
			continue
		}
		if st.dir == "" {
			if err := st.mount(); err != nil {
				return nil, err
			}
		}
		if err := writeCopy(st.path(i), m); err != nil {
			st.release()
			return nil, err
		}
	}
	return st, nil
}

func (st *copyStage) mount() error {
	dir, err := os.MkdirTemp("", "cryo-copies-")
	if err != nil {
		return fmt.Errorf("copied mounts: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		os.Remove(dir)
		return fmt.Errorf("copied mounts: mount stage: %w", err)
	}
	st.dir = dir
	return nil
}

func (st *copyStage) path(i int) string {
	if st.dir == "" {
		return ""
	}
	return filepath.Join(st.dir, strconv.Itoa(i))
}

// release detaches the stage (the container's binds of it stay) and
// removes its directory; it may be called more than once.
func (st *copyStage) release() {
	if st.dir == "" {
		return
	}
	unix.Unmount(st.dir, unix.MNT_DETACH)
	os.Remove(st.dir)
	st.dir = ""
}

// writeCopy writes a copied mount's content at base: the file itself, or
// the directory and the files under it.
func writeCopy(base string, m mountEntry) error {
	c := m.Copy
	if c.File {
		if len(c.Files) != 1 {
			return fmt.Errorf("copied mount %s: a file mount with %d files", m.Target, len(c.Files))
		}
		f := c.Files[0]
		f.Path = m.Target
		return writeFileAt(base, f)
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return fmt.Errorf("copied mount %s: %w", m.Target, err)
	}
	var dirs []fileEntry
	for _, f := range c.Files {
		if f.Dir {
			dirs = append(dirs, f)
			continue
		}
		dst, err := securePath(base, f.Path)
		if err != nil {
			return fmt.Errorf("copied mount %s: %w", m.Target, err)
		}
		f.Path = filepath.Join(m.Target, f.Path)
		if err := writeFileAt(dst, f); err != nil {
			return err
		}
	}
	// The directories' modes and owners last: one the host made 0500 is
	// filled first.
	for _, d := range dirs {
		dst, err := securePath(base, d.Path)
		if err != nil {
			return fmt.Errorf("copied mount %s: %w", m.Target, err)
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("copied mount %s: %w", m.Target, err)
		}
		if err := setModeOwner(dst, d); err != nil {
			return fmt.Errorf("copied mount %s: %w", filepath.Join(m.Target, d.Path), err)
		}
	}
	return nil
}

// mountCopy bind-mounts a copied mount at dst: from the stage when it is
// read-only, else from its content written at dst itself (a mount of its
// own stays writable under a read-only root, as a bind mount does).
func mountCopy(dst string, m mountEntry, staged string) error {
	src := dst
	if staged != "" && m.Flags&unix.MS_RDONLY != 0 {
		src = staged
		if err := makeMountPoint(dst, m.Copy.File); err != nil {
			return fmt.Errorf("copied mount %s: %w", m.Target, err)
		}
	} else if err := writeCopy(dst, m); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("copied mount %s: bind: %w", m.Target, err)
	}
	return nil
}

// makeMountPoint makes sure a file or a directory exists at dst.
func makeMountPoint(dst string, file bool) error {
	if !file {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// applyCopyFlags sets a copied mount's flags (ro, nosuid, nodev, noexec,
// atime) with a bind remount: a bind mount takes its flags from there, not
// from the bind. The flags are set as given, so a copy that is not nosuid
// does not inherit the stage's.
func applyCopyFlags(root string, m mountEntry) error {
	if m.Copy == nil {
		return nil
	}
	dst, err := securePath(root, m.Target)
	if err != nil {
		return err
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|m.Flags&bindRemountFlags, ""); err != nil {
		return fmt.Errorf("copied mount %s: apply options: %w", m.Target, err)
	}
	return nil
}
