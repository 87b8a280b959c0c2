package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// diffChunkSizes are the chunk sizes the incremental analysis compares.
var diffChunkSizes = []int64{64 << 10, 256 << 10, 1 << 20, 4 << 20}

// ramDiff says how the guest RAM of two snapshots differs: how many 4 KiB
// pages changed, and for each chunk size how many chunks hold a changed
// page against how many hold data at all (what a second checkpoint at that
// chunk size would upload, as a share of the first).
type ramDiff struct {
	pages, dataPages, changedPages int64
	chunks                         map[int64][2]int64 // size -> {changed, with data}
}

// diffRAM materializes the snapshots at url1 and url2 under dir and
// compares their RAM files.
func (r *runner) diffRAM(url1, url2, dir string) (ramDiff, error) {
	var d ramDiff
	ram := make([]string, 2)
	for i, u := range []string{url1, url2} {
		p, err := r.materializeRAM(r.ctx, u, filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			return d, err
		}
		ram[i] = p
	}
	a, err := os.Open(ram[0])
	if err != nil {
		return d, err
	}
	defer a.Close()
	b, err := os.Open(ram[1])
	if err != nil {
		return d, err
	}
	defer b.Close()
	d.chunks = map[int64][2]int64{}
	const page = 4096
	const block = 4 << 20 // the largest chunk size: a block holds whole chunks of every size
	ba, bb := make([]byte, block), make([]byte, block)
	zero := make([]byte, page)
	for off := int64(0); ; off += block {
		na, ea := io.ReadFull(a, ba)
		nb, eb := io.ReadFull(b, bb)
		n := max(na, nb)
		if n == 0 {
			break
		}
		clear(ba[na:n])
		clear(bb[nb:n])
		changed := make([]bool, (n+page-1)/page)
		data := make([]bool, len(changed))
		for p := range changed {
			x, y := ba[p*page:min(n, (p+1)*page)], bb[p*page:min(n, (p+1)*page)]
			changed[p] = !bytes.Equal(x, y)
			data[p] = !bytes.Equal(y, zero[:len(y)]) || !bytes.Equal(x, zero[:len(x)])
			d.pages++
			if changed[p] {
				d.changedPages++
			}
			if data[p] {
				d.dataPages++
			}
		}
		for _, cs := range diffChunkSizes {
			per := int(cs / page)
			for c := 0; c < len(changed); c += per {
				var ch, da bool
				for p := c; p < min(c+per, len(changed)); p++ {
					ch, da = ch || changed[p], da || data[p]
				}
				v := d.chunks[cs]
				if ch {
					v[0]++
				}
				if da {
					v[1]++
				}
				d.chunks[cs] = v
			}
		}
		if ea != nil || eb != nil {
			if n < block {
				break
			}
		}
	}
	return d, nil
}

// materializeRAM materializes a snapshot into dir (in this process, as
// the shim would) and returns its RAM file.
func (r *runner) materializeRAM(ctx context.Context, url, dir string) (string, error) {
	store, ref, err := stores.Open(ctx, url, r.s.Cfg.Stores.FetchOptions())
	if err != nil {
		return "", err
	}
	ropts, err := r.s.Cfg.Snapshot.ReadOptions("")
	if err != nil {
		return "", err
	}
	snap, err := snapshot.Open(ctx, store, ref, ropts)
	if err != nil {
		return "", err
	}
	m, err := snap.Materialize(ctx, nodecache.OpenSnapshots(dir))
	if err != nil {
		return "", err
	}
	if m.RAM == "" {
		return "", fmt.Errorf("snapshot %s has no RAM file", url)
	}
	return m.RAM, nil
}
