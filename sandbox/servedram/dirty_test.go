package servedram

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/cryo-runtime/cryo/pagefs"
)

func TestReadDirtyThresholds(t *testing.T) {
	page := int64(os.Getpagesize())
	vmstat := "nr_free_pages 4006496\nnr_dirty 28947\nnr_dirty_threshold 1131003\nnr_dirty_background_threshold 564811\npgpgin 1\n"
	got, err := readDirtyThresholds(strings.NewReader(vmstat))
	if err != nil {
		t.Fatal(err)
	}
	if want := (dirtyThresholds{Background: 564811 * page, Throttle: 1131003 * page}); got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"nr_dirty_threshold 1131003\n",                             // background missing
		"nr_dirty_threshold x\nnr_dirty_background_threshold 5\n",  // not a number
		"nr_dirty_threshold -1\nnr_dirty_background_threshold 5\n", // negative
		"nr_dirty 3\n", // neither
	} {
		if _, err := readDirtyThresholds(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// This node's, as the shim reads it.
	f, err := os.Open(vmstatPath)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	if th, err := readDirtyThresholds(f); err != nil || th.Background <= 0 || th.Throttle < th.Background {
		t.Errorf("this node's thresholds %+v, %v", th, err)
	}
}

func TestDirtyHeadroomWarning(t *testing.T) {
	th := dirtyThresholds{Background: 2 << 30, Throttle: 4 << 30}
	if w := dirtyHeadroomWarning(2<<30, th); w != "" {
		t.Errorf("a RAM the background threshold holds: %q", w)
	}
	w := dirtyHeadroomWarning(5<<30, th)
	for _, want := range []string{"2048 MiB", "4096 MiB", "5120 MiB", "vm.dirty_background_ratio", sysctlFile} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
}

// TestServeZeroWarnsDirtyLimits: a served RAM larger than the node's
// dirty background threshold is served (it works, slower), with one
// warning in the shim's log; one the threshold holds, without.
func TestServeZeroWarnsDirtyLimits(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("pagefs mounts need root")
	}
	f, err := os.Open(vmstatPath)
	if err != nil {
		t.Skip(err)
	}
	th, err := readDirtyThresholds(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Above the threshold: the layer is sparse and nothing is touched.
	above := (th.Background/pagefs.PageSize + 1024) * pagefs.PageSize
	for _, tc := range []struct {
		size  int64
		warns int
	}{{4 << 20, 0}, {above, 1}} {
		var logs bytes.Buffer
		l := logrus.New()
		l.SetOutput(&logs)
		ctx := log.WithLogger(context.Background(), logrus.NewEntry(l))
		dir := t.TempDir()
		o := Options{StateDir: dir, Layer: filepath.Join(dir, "cryo-test.layer"), PageTimeout: time.Second, StuckGrace: time.Second}
		r, err := ServeZero(ctx, tc.size, o)
		if err != nil {
			t.Fatal(err)
		}
		r.Close(context.Background())
		if got := strings.Count(logs.String(), "dirty background threshold"); got != tc.warns {
			t.Errorf("%d MiB served RAM under a %d MiB background threshold: %d warnings, want %d:\n%s",
				tc.size>>20, th.Background>>20, got, tc.warns, logs.String())
		}
	}
}
