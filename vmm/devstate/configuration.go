package devstate

// The configuration's subsections QEMU 7.2 knows (migration/savevm.c,
// vmstate_configuration); each is version 1.
const (
	subTargetPageBits = "configuration/target-page-bits"
	subCapabilities   = "configuration/capabilities"
	subUUID           = "configuration/uuid"

	capIgnoreShared = "x-ignore-shared"
	targetPageBits  = 12
	uuidSize        = 16
)

// configuration is the machine type and its subsections, copied as they
// are; Split only learns from them whether x-ignore-shared was on.
func (s *splitter) configuration() error {
	typ, err := s.in.u8("configuration marker")
	if err != nil {
		return err
	}
	if typ != configuration {
		return s.in.refuse("section type %#02x after the header: want the configuration (%#02x)", typ, configuration)
	}
	n, err := s.in.be32("machine type length")
	if err != nil {
		return err
	}
	if n == 0 || n > maxName {
		return s.in.refuse("machine type length %d: want 1 to %d", n, maxName)
	}
	if err := s.out.u8(typ); err != nil {
		return err
	}
	if err := s.out.be32(n); err != nil {
		return err
	}
	if err := s.copy(int(n), "machine type"); err != nil {
		return err
	}
	for {
		b, ok, err := s.in.peek()
		if err != nil {
			return err
		}
		if !ok || b != subsection {
			return nil
		}
		if err := s.subsection(); err != nil {
			return err
		}
	}
}

// subsection is one subsection of the configuration.
func (s *splitter) subsection() error {
	if err := s.copy(1, "subsection marker"); err != nil {
		return err
	}
	name, err := s.copyName("subsection name")
	if err != nil {
		return err
	}
	// name is only valid until the next read.
	var known string
	for _, k := range []string{subTargetPageBits, subCapabilities, subUUID} {
		if string(name) == k {
			known = k
		}
	}
	if known == "" {
		return s.in.refuse("configuration subsection %q: unknown", name)
	}
	version, err := s.in.be32("subsection version")
	if err != nil {
		return err
	}
	if version != 1 {
		return s.in.refuse("configuration subsection %s version %d: want 1", known, version)
	}
	if err := s.out.be32(version); err != nil {
		return err
	}
	switch known {
	case subTargetPageBits:
		return s.pageBits()
	case subCapabilities:
		return s.capabilities()
	default:
		return s.copy(uuidSize, "uuid")
	}
}

// pageBits checks that the target page is the PageSize every record is.
func (s *splitter) pageBits() error {
	bits, err := s.in.be32("target page bits")
	if err != nil {
		return err
	}
	if bits != targetPageBits {
		return s.in.refuse("target page bits %d: want %d", bits, targetPageBits)
	}
	return s.out.be32(bits)
}

// capabilities are the validated capabilities the source had on.
func (s *splitter) capabilities() error {
	n, err := s.in.be32("capability count")
	if err != nil {
		return err
	}
	if n > maxCaps {
		return s.in.refuse("capability count %d: over %d", n, maxCaps)
	}
	if err := s.out.be32(n); err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		c, err := s.copyName("capability")
		if err != nil {
			return err
		}
		if string(c) == capIgnoreShared {
			s.ignoreShared = true
		}
	}
	return nil
}

// copy copies n (≤ readBufSize) bytes to the output.
func (s *splitter) copy(n int, what string) error {
	b, err := s.in.next(n, what)
	if err != nil {
		return err
	}
	_, err = s.out.Write(b)
	return err
}

// copyName copies an idstr and its length to the output and returns it
// (valid until the next read).
func (s *splitter) copyName(what string) ([]byte, error) {
	b, err := s.in.name(what)
	if err != nil {
		return nil, err
	}
	return b, s.out.name(b)
}
