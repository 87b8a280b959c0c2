package e2bapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// DefaultGuardInterval is how often a GuardMonitor checks LabelGuard:
	// two reads by name each time, and at most this long between an admin
	// removing the guard and the API refusing.
	DefaultGuardInterval = 10 * time.Second
	// guardUnreadPolls is how many checks in a row may fail to read the
	// guard (the API server restarting, a timeout) before the monitor
	// stops trusting its last answer: an API server blip should not stop
	// the gateway, whose common path does not need the API server.
	guardUnreadPolls  = 3
	guardCheckTimeout = 10 * time.Second
)

var errGuardUnchecked = errors.New("label guard " + LabelGuard + " not checked yet")

// GuardMonitor keeps checking, while the controller runs, that LabelGuard
// is in force for the controller's identity (CheckLabelGuard), and tells
// the API and the gateway (Server.Guard) to refuse every request while it
// is not: without it, a tenant could label a pod with another tenant's
// sandbox id and receive that sandbox's traffic. It polls with get (the
// ClusterRole's two objects by name) rather than watching them: a watch by
// name would need list and watch on them as well.
//
// It runs on every replica, as the listeners do.
type GuardMonitor struct {
	Client client.Client
	// Interval between checks (DefaultGuardInterval).
	Interval time.Duration
	Log      logr.Logger

	mu      sync.Mutex
	user    string // the controller's identity, asked once
	err     error  // the last answer: nil while the guard is in force
	checked bool
	unread  int // checks in a row that could not read the guard
}

// Err is nil while the guard is in force; otherwise what is wrong with it.
func (m *GuardMonitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.checked {
		return errGuardUnchecked
	}
	return m.err
}

// Check checks the guard once and returns what Err says from then on. A
// check that only failed to read the guard keeps the previous answer, up
// to guardUnreadPolls in a row.
func (m *GuardMonitor) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, guardCheckTimeout)
	defer cancel()
	m.mu.Lock()
	user := m.user
	m.mu.Unlock()
	var err error
	if user == "" {
		user, err = whoAmI(ctx, m.Client)
	}
	if err == nil {
		err = checkGuardFor(ctx, m.Client, user)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	m.user = user
	prev, was := m.err, m.checked
	switch {
	case err == nil:
		m.unread = 0
	case unread(err) && was && m.unread+1 < guardUnreadPolls:
		m.unread++
		m.Log.Info("e2b label guard: cannot read it, keeping the last answer", "error", err.Error(), "checks", m.unread)
		return m.err
	case unread(err):
		err = fmt.Errorf("not read in %d checks: %w", m.unread+1, err)
	}
	m.err, m.checked = err, true
	switch {
	case err == nil && (prev != nil || !was):
		m.Log.Info("e2b label guard in force", "policy", LabelGuard, "controller", user)
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		m.Log.Error(err, "e2b label guard not in force: the E2B API and sandbox gateway answer 503 until it is back", "policy", LabelGuard, "controller", user)
	}
	return err
}

func (m *GuardMonitor) interval() time.Duration {
	if m.Interval > 0 {
		return m.Interval
	}
	return DefaultGuardInterval
}

// Start checks every Interval until ctx ends.
func (m *GuardMonitor) Start(ctx context.Context) error {
	t := time.NewTicker(m.interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = m.Check(ctx)
		}
	}
}

func (m *GuardMonitor) NeedLeaderElection() bool { return false }

// unguarded is why the API and the gateway refuse every request now, a
// 503: nil while Guard finds the label guard in force, or when there is no
// Guard.
func (s *Server) unguarded() error {
	if s.Guard == nil {
		return nil
	}
	if err := s.Guard.Err(); err != nil {
		return errf(http.StatusServiceUnavailable, "cryo's E2B API is off while its label guard is not in force: %v", err)
	}
	return nil
}
