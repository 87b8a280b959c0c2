package e2bapi

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

// list is the SDK's Sandbox.list: the namespace's running and paused
// sandboxes, filtered and paged as the SDK asks.
func (s *Server) list(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return 0, nil, errf(http.StatusBadRequest, "state: %q is neither running nor paused", st)
			}
			states[st] = true
		}
	}
	if len(states) == 0 {
		states = map[string]bool{"running": true, "paused": true}
	}
	want, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return 0, nil, err
	}
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return 0, nil, err
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return 0, nil, errf(http.StatusBadRequest, "startedAfter: %q is not an RFC 3339 time", v)
		}
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		return 0, nil, errf(http.StatusBadRequest, "order: %q is neither asc nor desc", order)
	}
	sbs, err := s.sandboxes(ctx, ns)
	if err != nil {
		return 0, nil, err
	}
	var all []listedBody
	for _, sb := range sbs {
		if !states[sb.state()] {
			continue
		}
		d := s.detail(sb)
		if matches(d.Metadata, want) && (q.Get("template") == "" || q.Get("template") == d.TemplateID) &&
			(after.IsZero() || !startedAt(d).Before(after)) {
			all = append(all, d)
		}
	}
	return http.StatusOK, pageOfSandboxes(all, order == "asc", q.Get("nextToken"), limit), nil
}

func startedAt(d listedBody) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, d.StartedAt)
	return t
}

// sandboxCursor orders sandboxes by start time, then id; it is also the
// page token, so that a page starts right after the last one shown even
// when that sandbox is gone since.
func sandboxCursor(d listedBody) string {
	return fmt.Sprintf("%020d.%s", startedAt(d).UnixNano(), d.SandboxID)
}

// pageOfSandboxes is E2B's order (newest first unless asc) from the
// cursor on, limit long.
func pageOfSandboxes(all []listedBody, asc bool, from string, limit int) paged {
	before := func(a, b string) bool { return a < b }
	if !asc {
		before = func(a, b string) bool { return a > b }
	}
	sort.Slice(all, func(i, j int) bool { return before(sandboxCursor(all[i]), sandboxCursor(all[j])) })
	var page paged
	out := []listedBody{}
	for _, d := range all {
		if from != "" && !before(from, sandboxCursor(d)) {
			continue
		}
		if len(out) == limit {
			page.next = sandboxCursor(out[limit-1])
			break
		}
		out = append(out, d)
	}
	page.items = out
	return page
}

// pageLimit is a list's page size: the query's limit, at most
// maxPageSize, else defaultPageSize.
func pageLimit(v string) (int, error) {
	if v == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, errf(http.StatusBadRequest, "limit: %q is not a positive number", v)
	}
	return min(n, maxPageSize), nil
}

// metadataFilter decodes the SDK's metadata query: a URL-encoded query
// string of URL-encoded keys and values.
func metadataFilter(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	pairs, err := parseQuery(v)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "metadata: %v", err)
	}
	return pairs, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// sandboxes are those of ns, running or paused, as Server.Cache holds
// them: two reads of the cache, however many sandboxes, where a read of
// each from the API server cost two lists apiece. A list may lag the
// API's other answers by the informer's delay (milliseconds): a sandbox
// just killed may be listed once more, as on any eventually consistent
// list.
func (s *Server) sandboxes(ctx context.Context, ns string) ([]*sandbox, error) {
	r := s.cache()
	pods, cps, err := sandboxObjects(ctx, r, client.InNamespace(ns), client.HasLabels{LabelSandbox})
	if err != nil {
		return nil, err
	}
	podsOf := map[string][]corev1.Pod{}
	for _, p := range pods {
		podsOf[p.Labels[LabelSandbox]] = append(podsOf[p.Labels[LabelSandbox]], p)
	}
	cpsOf := map[string][]cryov1.Checkpoint{}
	for _, c := range cps {
		cpsOf[c.Labels[LabelSandbox]] = append(cpsOf[c.Labels[LabelSandbox]], c)
	}
	for id := range cpsOf {
		if _, ok := podsOf[id]; !ok {
			podsOf[id] = nil // paused: no pod
		}
	}
	var out []*sandbox
	for id, ps := range podsOf {
		// settle reads the API server only for a sandbox the cache
		// shows resumed and gone (resumedGone), which it may show
		// before the resumed pod.
		sb, found := assemble(ns, id, ps, cpsOf[id])
		sb, found, err := s.settle(ctx, sb, found)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, sb)
		}
	}
	return out, nil
}

// cache is where lists read: Cache, else (tests) Client.
func (s *Server) cache() client.Reader {
	if s.Cache != nil {
		return s.Cache
	}
	return s.Client
}
