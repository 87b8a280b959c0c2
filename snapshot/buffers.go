package snapshot

import "bytes"

// bufPool is a free list of equal buffers. The writer's tokens bound how
// many are in use, so at most that many are ever allocated, and none become
// garbage (unlike sync.Pool, whose dropped buffers the GC collects late).
type bufPool struct {
	free chan *[]byte
	size int64
}

func newBufPool(n int, size int64) *bufPool {
	return &bufPool{free: make(chan *[]byte, n), size: size}
}

func (p *bufPool) get() *[]byte {
	select {
	case b := <-p.free:
		return b
	default:
		b := make([]byte, p.size)
		return &b
	}
}

func (p *bufPool) put(b *[]byte) {
	*b = (*b)[:cap(*b)]
	select {
	case p.free <- b:
	default:
	}
}

var zeroBlock [64 << 10]byte

// isZero reports whether b is all zeros (memcmp against a zero block).
func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroBlock))
		if !bytes.Equal(b[:n], zeroBlock[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
