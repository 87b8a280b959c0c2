package envd

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/filesystem"
	"github.com/cryo-runtime/cryo/agent/envd/spec/filesystem/filesystemconnect"
)

const fsToken = "secret"

// fsEnv is a Server over a temp dir made to look like a container's root:
// /etc/passwd with root and user (1000, home /home/user), /home/user.
type fsEnv struct {
	root string
	s    *Server
	ts   *httptest.Server
}

func newFSEnv(t *testing.T) *fsEnv {
	t.Helper()
	root := t.TempDir()
	mkdirOwned(t, filepath.Join(root, "etc"), 0, 0)
	mkdirOwned(t, filepath.Join(root, "home/user"), 1000, 1000)
	writeHostFile(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n")
	writeHostFile(t, filepath.Join(root, "etc/group"), "root:x:0:\nuser:x:1000:\n")
	s := New(dirContainer(root), sha256.Sum256([]byte(fsToken)))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return &fsEnv{root: root, s: s, ts: ts}
}

// host is the agent's view of a container path.
func (e *fsEnv) host(p string) string { return filepath.Join(e.root, p) }

func mkdirOwned(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func writeHostFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlinkHost(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// codecs runs fn with a client of each codec the SDK may use: the default
// binary proto and Connect's JSON.
func (e *fsEnv) codecs(t *testing.T, fn func(t *testing.T, c filesystemconnect.FilesystemClient)) {
	t.Run("proto", func(t *testing.T) {
		fn(t, filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL))
	})
	t.Run("json", func(t *testing.T) {
		fn(t, filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL, connect.WithProtoJSON()))
	})
}

// req is a request as the SDK sends it: the token, and the user as Basic
// auth ("" for none).
func fsReq[T any](msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("X-Access-Token", fsToken)
	if user != "" {
		hr := &http.Request{Header: r.Header()}
		hr.SetBasicAuth(user, "")
	}
	return r
}

func wantFSCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("got error %v, want code %v", err, code)
	}
}

func ownerOf(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func TestStat(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/home/user/f.txt"), "hello")
	os.Chmod(e.host("/home/user/f.txt"), 0o640)
	os.Chown(e.host("/home/user/f.txt"), 1000, 1000)
	symlinkHost(t, "f.txt", e.host("/home/user/link"))
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		resp, err := c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "f.txt"}, "user"))
		if err != nil {
			t.Fatal(err)
		}
		got := resp.Msg.GetEntry()
		if got.GetName() != "f.txt" || got.GetPath() != "/home/user/f.txt" || got.GetType() != rpc.FileType_FILE_TYPE_FILE ||
			got.GetSize() != 5 || got.GetMode() != 0o640 || got.GetPermissions() != "-rw-r-----" ||
			got.GetOwner() != "user" || got.GetGroup() != "user" || got.GetModifiedTime().AsTime().IsZero() || got.SymlinkTarget != nil {
			t.Fatalf("Stat(f.txt) = %v", got)
		}

		resp, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/home/user/link"}, ""))
		if err != nil {
			t.Fatal(err)
		}
		got = resp.Msg.GetEntry()
		if got.GetType() != rpc.FileType_FILE_TYPE_FILE || got.GetSymlinkTarget() != "/home/user/f.txt" ||
			got.GetMode() != 0o640 || !strings.HasPrefix(got.GetPermissions(), "L") || got.GetOwner() != "root" {
			t.Fatalf("Stat(link) = %v", got)
		}

		resp, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/"}, ""))
		if err != nil || resp.Msg.GetEntry().GetType() != rpc.FileType_FILE_TYPE_DIRECTORY {
			t.Fatalf("Stat(/) = %v, %v", resp, err)
		}

		_, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/nope"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
		_, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "~other/x"}, ""))
		wantFSCode(t, err, connect.CodeInvalidArgument)
		_, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "f.txt"}, "nobody"))
		wantFSCode(t, err, connect.CodeUnauthenticated)
		if err == nil || !strings.Contains(err.Error(), "nobody") {
			t.Fatalf("an unknown user's error does not name it: %v", err)
		}
	})
}

// Symlinks the container makes resolve inside its root: one to /etc/passwd
// is the container's, one to a directory of the host is that path inside
// the root, and ".." stops at the root.
func TestSymlinksStayInRoot(t *testing.T) {
	e := newFSEnv(t)
	outside := t.TempDir()
	writeHostFile(t, filepath.Join(outside, "secret"), "host")
	symlinkHost(t, "/etc/passwd", e.host("/home/user/passwd"))
	symlinkHost(t, "../../../../../../etc/passwd", e.host("/home/user/rel"))
	symlinkHost(t, outside, e.host("/home/user/out"))
	symlinkHost(t, "passwd", e.host("/home/user/chain"))
	symlinkHost(t, "out/secret", e.host("/home/user/dangle"))
	symlinkHost(t, "loop2", e.host("/home/user/loop1"))
	symlinkHost(t, "/home/user/loop1", e.host("/home/user/loop2"))
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		resp, err := c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/home/user/rel"}, ""))
		if err != nil || resp.Msg.GetEntry().GetSymlinkTarget() != "/etc/passwd" || resp.Msg.GetEntry().GetSize() != int64(len("../../../../../../etc/passwd")) {
			t.Fatalf("Stat(rel) = %v, %v", resp, err)
		}
		// A link to a link resolves inside the root too; a dangling link
		// and a loop show the link's own path, as E2B's envd answers.
		resp, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/home/user/chain"}, ""))
		if err != nil || resp.Msg.GetEntry().GetSymlinkTarget() != "/etc/passwd" {
			t.Fatalf("Stat(chain) = %v, %v", resp, err)
		}
		for _, p := range []string{"/home/user/dangle", "/home/user/loop1"} {
			resp, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: p}, ""))
			if err != nil || resp.Msg.GetEntry().GetSymlinkTarget() != p {
				t.Fatalf("Stat(%s) = %v, %v", p, resp, err)
			}
		}
		// The host's directory is not there inside the root.
		_, err = c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{Path: "/home/user/out"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
		_, err = c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "/home/user/out/secret"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
		// The link dangles inside the root: nothing is made, anywhere.
		_, err = c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "/home/user/out/made"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
		mkdirOwned(t, e.host(outside), 0, 0)
		if _, err := c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "/home/user/out/made"}, "")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(outside, "made")); err == nil {
			t.Fatal("MakeDir through a symlink created a directory outside the root")
		}
		if _, err := os.Stat(e.host(filepath.Join(outside, "made"))); err != nil {
			t.Fatalf("MakeDir through a symlink: not inside the root: %v", err)
		}
		os.RemoveAll(e.host(outside))
		if _, err := c.Move(context.Background(), fsReq(&rpc.MoveRequest{Source: "/home/user/out/secret", Destination: "/x"}, "")); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("Move from outside the root: %v", err)
		}
		// Remove of a symlink removes the link, not what it points to.
		if _, err := c.Remove(context.Background(), fsReq(&rpc.RemoveRequest{Path: "/home/user/out"}, "")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
			t.Fatalf("Remove of a symlink removed its target: %v", err)
		}
		symlinkHost(t, outside, e.host("/home/user/out"))
	})
}

func TestListDir(t *testing.T) {
	e := newFSEnv(t)
	outside := t.TempDir()
	writeHostFile(t, filepath.Join(outside, "hostfile"), "host")
	writeHostFile(t, e.host("/w/a/b/c/deep"), "x")
	writeHostFile(t, e.host("/w/a/f"), "x")
	writeHostFile(t, e.host("/w/z"), "x")
	symlinkHost(t, "/w/a", e.host("/w/linkdir"))
	symlinkHost(t, outside, e.host("/w/a/out"))
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		for _, tc := range []struct {
			depth uint32
			want  string
		}{
			{0, "/w/a /w/linkdir /w/z"},
			{1, "/w/a /w/linkdir /w/z"},
			{2, "/w/a /w/a/b /w/a/f /w/a/out /w/linkdir /w/z"},
			{9, "/w/a /w/a/b /w/a/b/c /w/a/b/c/deep /w/a/f /w/a/out /w/linkdir /w/z"},
		} {
			resp, err := c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{Path: "/w", Depth: tc.depth}, ""))
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, en := range resp.Msg.GetEntries() {
				paths = append(paths, en.GetPath())
			}
			if got := strings.Join(paths, " "); got != tc.want {
				t.Errorf("ListDir(/w, depth %d) = %s, want %s", tc.depth, got, tc.want)
			}
		}
		// A symlinked directory is listed through the requested path.
		resp, err := c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{Path: "/w/linkdir"}, ""))
		if err != nil || len(resp.Msg.GetEntries()) != 3 || resp.Msg.GetEntries()[0].GetPath() != "/w/linkdir/b" ||
			resp.Msg.GetEntries()[0].GetType() != rpc.FileType_FILE_TYPE_DIRECTORY {
			t.Fatalf("ListDir(/w/linkdir) = %v, %v", resp, err)
		}
		_, err = c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{Path: "/w/z"}, ""))
		wantFSCode(t, err, connect.CodeInvalidArgument)
		_, err = c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{Path: "/nope"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
	})
}

func TestMakeDir(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/home/user/file"), "x")
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		os.RemoveAll(e.host("/home/user/a"))
		resp, err := c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "a/b/c"}, "user"))
		if err != nil {
			t.Fatal(err)
		}
		if en := resp.Msg.GetEntry(); en.GetPath() != "/home/user/a/b/c" || en.GetName() != "c" || en.GetType() != rpc.FileType_FILE_TYPE_DIRECTORY {
			t.Fatalf("MakeDir = %v", en)
		}
		for _, p := range []string{"/home/user/a", "/home/user/a/b", "/home/user/a/b/c"} {
			if uid, gid := ownerOf(t, e.host(p)); uid != 1000 || gid != 1000 {
				t.Errorf("%s owned by %d:%d, want the user's 1000:1000", p, uid, gid)
			}
		}
		if uid, _ := ownerOf(t, e.host("/home")); uid != 0 {
			t.Errorf("MakeDir chowned an existing parent")
		}
		_, err = c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "a/b/c"}, "user"))
		wantFSCode(t, err, connect.CodeAlreadyExists)
		_, err = c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "file"}, "user"))
		wantFSCode(t, err, connect.CodeInvalidArgument)
		_, err = c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "file/sub"}, "user"))
		wantFSCode(t, err, connect.CodeInvalidArgument)
	})
}

func TestMove(t *testing.T) {
	e := newFSEnv(t)
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		writeHostFile(t, e.host("/src"), "moved")
		os.RemoveAll(e.host("/home/user/new"))
		resp, err := c.Move(context.Background(), fsReq(&rpc.MoveRequest{Source: "/src", Destination: "new/dir/dst"}, "user"))
		if err != nil {
			t.Fatal(err)
		}
		if en := resp.Msg.GetEntry(); en.GetPath() != "/home/user/new/dir/dst" || en.GetSize() != 5 {
			t.Fatalf("Move = %v", en)
		}
		if b, err := os.ReadFile(e.host("/home/user/new/dir/dst")); err != nil || string(b) != "moved" {
			t.Fatalf("moved file: %q %v", b, err)
		}
		if uid, _ := ownerOf(t, e.host("/home/user/new/dir")); uid != 1000 {
			t.Errorf("Move's new parent owned by %d, want 1000", uid)
		}
		_, err = c.Move(context.Background(), fsReq(&rpc.MoveRequest{Source: "/src", Destination: "/elsewhere"}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
	})
}

func TestRemove(t *testing.T) {
	e := newFSEnv(t)
	outside := t.TempDir()
	writeHostFile(t, filepath.Join(outside, "keep"), "host")
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		writeHostFile(t, e.host("/tree/a/b/file"), "x")
		writeHostFile(t, e.host("/tree/top"), "x")
		symlinkHost(t, outside, e.host("/tree/a/out"))
		if _, err := c.Remove(context.Background(), fsReq(&rpc.RemoveRequest{Path: "/tree"}, "")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(e.host("/tree")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("/tree still there: %v", err)
		}
		if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
			t.Fatalf("Remove followed a symlink out: %v", err)
		}
		if _, err := c.Remove(context.Background(), fsReq(&rpc.RemoveRequest{Path: "/tree"}, "")); err != nil {
			t.Fatalf("Remove of a missing path: %v", err)
		}
		_, err := c.Remove(context.Background(), fsReq(&rpc.RemoveRequest{Path: "/"}, ""))
		wantFSCode(t, err, connect.CodeInvalidArgument)
	})
}

// The default user is /init's defaultUser, else the container's own.
func TestFilesDefaultUser(t *testing.T) {
	e := newFSEnv(t)
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL)
	resp, err := c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "d0"}, ""))
	if err != nil || resp.Msg.GetEntry().GetPath() != "/root/d0" || resp.Msg.GetEntry().GetOwner() != "root" {
		t.Fatalf("MakeDir as the container's user: %v %v", resp, err)
	}
	initEnvd(t, e.ts.URL+"/init", `{"accessToken":"secret","defaultUser":"user"}`)
	resp, err = c.MakeDir(context.Background(), fsReq(&rpc.MakeDirRequest{Path: "d1"}, ""))
	if err != nil || resp.Msg.GetEntry().GetPath() != "/home/user/d1" || resp.Msg.GetEntry().GetOwner() != "user" {
		t.Fatalf("MakeDir as /init's default user: %v %v", resp, err)
	}
	// An empty path is /init's default workdir; a relative one stays
	// under the home, as E2B's envd resolves them.
	writeHostFile(t, e.host("/work/in-workdir"), "x")
	initEnvd(t, e.ts.URL+"/init", `{"accessToken":"secret","defaultUser":"user","defaultWorkdir":"/work"}`)
	list, err := c.ListDir(context.Background(), fsReq(&rpc.ListDirRequest{}, ""))
	if err != nil || len(list.Msg.GetEntries()) != 1 || list.Msg.GetEntries()[0].GetPath() != "/work/in-workdir" {
		t.Fatalf("ListDir of the default workdir: %v %v", list, err)
	}
	st, err := c.Stat(context.Background(), fsReq(&rpc.StatRequest{Path: "d1"}, ""))
	if err != nil || st.Msg.GetEntry().GetPath() != "/home/user/d1" {
		t.Fatalf("Stat(d1) with a default workdir: %v %v", st, err)
	}
}

func initEnvd(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %d", url, resp.StatusCode)
	}
}

// TestFullDiskCodes: a full disk is Internal to the RPCs, as E2B's envd
// answers it (the SDK would take ResourceExhausted for a rate limit), and
// 507 to an upload, as E2B's envd answers that.
func TestFullDiskCodes(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT} {
		err := &os.PathError{Op: "write", Path: "/f", Err: errno}
		if code := connect.CodeOf(fsError(err)); code != connect.CodeInternal {
			t.Errorf("%v: code %v, want internal", errno, code)
		}
		if got := filesStatus(err); got != http.StatusInsufficientStorage {
			t.Errorf("%v: upload status %d, want 507", errno, got)
		}
		if got := filesStatus(fsError(err)); got != http.StatusInsufficientStorage {
			t.Errorf("%v as a Connect error: upload status %d, want 507", errno, got)
		}
	}
}
