package busybox

import (
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
)

type digestT = digest.Digest

func versioned() specs.Versioned { return specs.Versioned{SchemaVersion: 2} }
