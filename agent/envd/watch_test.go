package envd

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/filesystem"
	"github.com/cryo-runtime/cryo/agent/envd/spec/filesystem/filesystemconnect"
)

// changeTree makes, in /w, each kind of change a watch reports, and
// returns the events it must see.
func changeTree(t *testing.T, e *fsEnv) []string {
	t.Helper()
	writeHostFile(t, e.host("/w/new"), "")
	f, err := os.OpenFile(e.host("/w/new"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("data")
	f.Close()
	os.Chmod(e.host("/w/new"), 0o600)
	if err := os.Rename(e.host("/w/new"), e.host("/w/renamed")); err != nil {
		t.Fatal(err)
	}
	os.Remove(e.host("/w/renamed"))
	// A directory made after the watch started is watched too.
	os.Mkdir(e.host("/w/later"), 0o755)
	time.Sleep(300 * time.Millisecond)
	writeHostFile(t, e.host("/w/later/inner"), "x")
	writeHostFile(t, e.host("/w/sub/nested"), "x")
	return []string{
		"CREATE new", "WRITE new", "CHMOD new", "RENAME new", "CREATE renamed", "REMOVE renamed",
		"CREATE later", "CREATE later/inner", "CREATE sub/nested", "WRITE sub/nested",
	}
}

func fsEventString(e *rpc.FilesystemEvent) string {
	return strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_") + " " + e.GetName()
}

// wantEvents fails unless every wanted event is among got.
func hasEvents(t *testing.T, got map[string]bool, want []string) bool {
	for _, w := range want {
		if !got[w] {
			return false
		}
	}
	return true
}

func TestWatchDir(t *testing.T) {
	e := newFSEnv(t)
	mkdirOwned(t, e.host("/w/sub"), 0, 0)
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		os.RemoveAll(e.host("/w/later"))
		os.Remove(e.host("/w/sub/nested"))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream, err := c.WatchDir(ctx, fsReq(&rpc.WatchDirRequest{Path: "/w", Recursive: true}, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() || stream.Msg().GetStart() == nil {
			t.Fatalf("first message %v, %v: want the start event", stream.Msg(), stream.Err())
		}
		want := changeTree(t, e)
		got := map[string]bool{}
		for !hasEvents(t, got, want) && stream.Receive() {
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				got[fsEventString(fe)] = true
			}
		}
		if !hasEvents(t, got, want) {
			t.Fatalf("events %v (%v), want %v", got, stream.Err(), want)
		}
	})
}

func TestWatchDirKeepalive(t *testing.T) {
	e := newFSEnv(t)
	mkdirOwned(t, e.host("/w"), 0, 0)
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := fsReq(&rpc.WatchDirRequest{Path: "/w"}, "")
	r.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := c.WatchDir(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	stream.Receive() // start
	start := time.Now()
	if !stream.Receive() || stream.Msg().GetKeepalive() == nil {
		t.Fatalf("got %v, %v: want a keepalive", stream.Msg(), stream.Err())
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("keepalive after %v, asked every 1s", d)
	}
}

func TestWatchDirErrors(t *testing.T) {
	e := newFSEnv(t)
	writeHostFile(t, e.host("/file"), "x")
	// A symlink to a directory of the host leads inside the root, where
	// there is none.
	symlinkHost(t, t.TempDir(), e.host("/out"))
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL)
	for path, code := range map[string]connect.Code{"/nope": connect.CodeNotFound, "/file": connect.CodeInvalidArgument, "/out": connect.CodeNotFound} {
		stream, err := c.WatchDir(context.Background(), fsReq(&rpc.WatchDirRequest{Path: path}, ""))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
			stream.Close()
		}
		if connect.CodeOf(err) != code {
			t.Errorf("WatchDir(%s): %v, want %v", path, err, code)
		}
	}
	_, err := c.CreateWatcher(context.Background(), fsReq(&rpc.CreateWatcherRequest{Path: "/nope"}, ""))
	wantFSCode(t, err, connect.CodeNotFound)
}

func TestPolledWatcher(t *testing.T) {
	e := newFSEnv(t)
	mkdirOwned(t, e.host("/w/sub"), 0, 0)
	e.codecs(t, func(t *testing.T, c filesystemconnect.FilesystemClient) {
		os.RemoveAll(e.host("/w/later"))
		os.Remove(e.host("/w/sub/nested"))
		ctx := context.Background()
		resp, err := c.CreateWatcher(ctx, fsReq(&rpc.CreateWatcherRequest{Path: "/w", Recursive: true}, ""))
		if err != nil {
			t.Fatal(err)
		}
		id := resp.Msg.GetWatcherId()
		want := changeTree(t, e)
		got := map[string]bool{}
		for deadline := time.Now().Add(10 * time.Second); !hasEvents(t, got, want) && time.Now().Before(deadline); {
			ev, err := c.GetWatcherEvents(ctx, fsReq(&rpc.GetWatcherEventsRequest{WatcherId: id}, ""))
			if err != nil {
				t.Fatal(err)
			}
			for _, fe := range ev.Msg.GetEvents() {
				got[fsEventString(fe)] = true
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !hasEvents(t, got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if _, err := c.RemoveWatcher(ctx, fsReq(&rpc.RemoveWatcherRequest{WatcherId: id}, "")); err != nil {
			t.Fatal(err)
		}
		_, err = c.GetWatcherEvents(ctx, fsReq(&rpc.GetWatcherEventsRequest{WatcherId: id}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
		_, err = c.RemoveWatcher(ctx, fsReq(&rpc.RemoveWatcherRequest{WatcherId: id}, ""))
		wantFSCode(t, err, connect.CodeNotFound)
	})
}

// Watchers and their queues are bounded: a watcher past its queue stops
// with Internal once drained, and no more than maxWatchers live (Internal
// past them), as E2B's envd answers a watcher's error: the SDK would take
// ResourceExhausted for a rate limit.
func TestPolledWatcherBounds(t *testing.T) {
	defer func(n, q int) { maxWatchers, maxQueuedEvents = n, q }(maxWatchers, maxQueuedEvents)
	maxWatchers, maxQueuedEvents = 2, 5
	e := newFSEnv(t)
	mkdirOwned(t, e.host("/w"), 0, 0)
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL)
	ctx := context.Background()
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			c.RemoveWatcher(ctx, fsReq(&rpc.RemoveWatcherRequest{WatcherId: id}, ""))
		}
	})
	for i := 0; i < 2; i++ {
		resp, err := c.CreateWatcher(ctx, fsReq(&rpc.CreateWatcherRequest{Path: "/w"}, ""))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.GetWatcherId())
	}
	_, err := c.CreateWatcher(ctx, fsReq(&rpc.CreateWatcherRequest{Path: "/w"}, ""))
	wantFSCode(t, err, connect.CodeInternal)

	for i := 0; i < 10; i++ {
		writeHostFile(t, e.host(fmt.Sprintf("/w/f%d", i)), "")
	}
	time.Sleep(time.Second) // for the watch to read all 10 events, past its queue
	var total int
	deadline := time.Now().Add(10 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ev, err := c.GetWatcherEvents(ctx, fsReq(&rpc.GetWatcherEventsRequest{WatcherId: ids[0]}, ""))
		if connect.CodeOf(err) == connect.CodeInternal {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		total += len(ev.Msg.GetEvents())
	}
	if total != 5 || time.Now().After(deadline) {
		t.Fatalf("got %d events before Internal, want the queue's 5", total)
	}
	if _, err := c.RemoveWatcher(ctx, fsReq(&rpc.RemoveWatcherRequest{WatcherId: ids[0]}, "")); err != nil {
		t.Fatal(err)
	}
	resp, err := c.CreateWatcher(ctx, fsReq(&rpc.CreateWatcherRequest{Path: "/w"}, ""))
	if err != nil {
		t.Fatalf("a watcher after one was removed: %v", err)
	}
	ids = append(ids, resp.Msg.GetWatcherId())
}

// A directory renamed inside the watched tree is reported under its new
// name; one moved out of it is no longer reported.
func TestWatchDirMovedDirs(t *testing.T) {
	e := newFSEnv(t)
	mkdirOwned(t, e.host("/w/in"), 0, 0)
	mkdirOwned(t, e.host("/w/away"), 0, 0)
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.ts.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.WatchDir(ctx, fsReq(&rpc.WatchDirRequest{Path: "/w", Recursive: true}, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	stream.Receive() // start
	os.Rename(e.host("/w/in"), e.host("/w/renamed"))
	os.Rename(e.host("/w/away"), e.host("/gone"))
	time.Sleep(300 * time.Millisecond)
	writeHostFile(t, e.host("/gone/outside"), "x")
	writeHostFile(t, e.host("/w/renamed/inside"), "x")
	writeHostFile(t, e.host("/w/last"), "x")
	got := map[string]bool{}
	for !got["CREATE last"] && stream.Receive() {
		if fe := stream.Msg().GetFilesystem(); fe != nil {
			got[fsEventString(fe)] = true
		}
	}
	if !got["CREATE renamed/inside"] || !got["RENAME away"] {
		t.Errorf("events %v: want CREATE renamed/inside and RENAME away", got)
	}
	for ev := range got {
		if strings.Contains(ev, "outside") || strings.Contains(ev, "in/inside") {
			t.Errorf("event %q of a directory no longer watched under that name", ev)
		}
	}
}
