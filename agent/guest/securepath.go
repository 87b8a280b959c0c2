package guest

import securejoin "github.com/cyphar/filepath-securejoin"

// securePath resolves unsafe (a path inside the container) under root the way
// the container would see it: symlinks are followed relative to root and ".."
// never leaves it. Missing components are kept as they are. It runs while the
// agent sets the container up, before the container's own processes run; as
// runc's use of the same call, it does not hold against another container of
// the pod changing a volume they share during the walk.
func securePath(root, unsafe string) (string, error) {
	return securejoin.SecureJoin(root, unsafe)
}
