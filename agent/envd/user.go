package envd

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// User is a user of the container, from its own /etc/passwd and /etc/group.
type User struct {
	Name     string
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	Home     string
}

// maxAccountFile bounds what is read of /etc/passwd or /etc/group: the
// container's, so the tenant's to make as large as it likes.
const maxAccountFile = 4 << 20

// openInRoot opens name as the container would: symlinks and ".." resolve
// inside root (openat2 RESOLVE_IN_ROOT), so no path the container makes can
// reach the agent's own files.
func openInRoot(root, name string, flags int, mode uint32) (*os.File, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// lookupUser finds name (or a numeric uid) in the container's /etc/passwd,
// and its groups in /etc/group.
func lookupUser(root, name string) (User, error) {
	var u User
	found := false
	err := eachLine(root, "/etc/passwd", func(f []string) bool {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 7 || (f[0] != name && f[2] != name) {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		u = User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5]}
		found = true
		return false
	})
	if err != nil && !os.IsNotExist(err) {
		return User{}, err
	}
	if !found {
		uid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			return User{}, fmt.Errorf("user %q not found in the sandbox's /etc/passwd", name)
		}
		// A numeric uid with no entry runs as itself, as runc does.
		return User{Name: name, UID: uint32(uid), GID: uint32(uid), Home: "/"}, nil
	}
	err = eachLine(root, "/etc/group", func(f []string) bool {
		// name:password:gid:members
		if len(f) < 4 {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == u.Name {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					u.Groups = append(u.Groups, uint32(gid))
				}
			}
		}
		return true
	})
	if err != nil && !os.IsNotExist(err) {
		return User{}, err
	}
	return u, nil
}

// eachLine calls fn with the colon-separated fields of each line of a
// file of the container until fn returns false.
func eachLine(root, name string, fn func([]string) bool) error {
	f, err := openInRoot(root, name, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxAccountFile))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	return sc.Err()
}

// requestUser is the user a request names: the SDK sends HTTP basic auth
// with the user name and an empty password, or nothing for the default.
// ok is false when the request names none.
func requestUser(r *http.Request) (name string, ok bool, err error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false, nil
	}
	b, found := strings.CutPrefix(h, "Basic ")
	if !found {
		return "", false, fmt.Errorf("authorization header: want Basic")
	}
	raw, err := base64.StdEncoding.DecodeString(b)
	if err != nil {
		return "", false, fmt.Errorf("authorization header: %w", err)
	}
	name, _, _ = strings.Cut(string(raw), ":")
	if name == "" {
		return "", false, nil
	}
	return name, true, nil
}

// defaultUser is the user of a request that names none: /init's default,
// else "" (the container's own process user, which the caller resolves).
func (s *Server) defaultUser() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.user
}
