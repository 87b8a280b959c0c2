package e2bapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// metricBody is the SDK's SandboxMetric.
type metricBody struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int64   `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       uint64  `json:"memUsed"`
	MemTotal      uint64  `json:"memTotal"`
	MemCache      uint64  `json:"memCache"`
	DiskUsed      uint64  `json:"diskUsed"`
	DiskTotal     uint64  `json:"diskTotal"`
}

// statsSummary is the part of the kubelet's /stats/summary read here.
type statsSummary struct {
	Pods []struct {
		PodRef struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"podRef"`
		CPU *struct {
			UsageNanoCores *uint64 `json:"usageNanoCores"`
		} `json:"cpu"`
		Memory *struct {
			AvailableBytes  *uint64 `json:"availableBytes"`
			UsageBytes      *uint64 `json:"usageBytes"`
			WorkingSetBytes *uint64 `json:"workingSetBytes"`
			RSSBytes        *uint64 `json:"rssBytes"`
		} `json:"memory"`
		EphemeralStorage *struct {
			CapacityBytes *uint64 `json:"capacityBytes"`
			UsedBytes     *uint64 `json:"usedBytes"`
		} `json:"ephemeral-storage"`
	} `json:"pods"`
}

// metrics answers one sample, now: E2B keeps a history, cryo keeps no
// state of its own. Totals are the pod's limits; usage is the kubelet's
// stats summary of the pod, read through the API server's node proxy,
// and zero when the kubelet does not report it. A paused sandbox has no
// pod and no sample: an empty list.
func (s *Server) metrics(ctx context.Context, ns string, r *http.Request) (int, any, error) {
	for _, k := range []string{"start", "end"} {
		if v := r.URL.Query().Get(k); v != "" {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return 0, nil, errf(http.StatusBadRequest, "%s: %q is not a Unix time in seconds", k, v)
			}
		}
	}
	sb, err := s.mustFind(ctx, ns, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.pod == nil {
		return http.StatusOK, []metricBody{}, nil
	}
	now := s.now()
	m := metricBody{Timestamp: now.UTC().Format(time.RFC3339), TimestampUnix: now.Unix(), CPUCount: 1}
	lim := sb.pod.Spec.Containers[0].Resources.Limits
	if c, ok := lim[corev1.ResourceCPU]; ok && c.Value() > 0 {
		m.CPUCount = c.Value()
	}
	if q, ok := lim[corev1.ResourceMemory]; ok {
		m.MemTotal = uint64(q.Value())
	}
	if q, ok := lim[corev1.ResourceEphemeralStorage]; ok {
		m.DiskTotal = uint64(q.Value())
	}
	s.usage(ctx, sb.pod, &m)
	return http.StatusOK, []metricBody{m}, nil
}

// usage fills m from the kubelet's stats of pod. Failures are logged and
// leave zeros: a metrics call is no reason to fail a sandbox.
func (s *Server) usage(ctx context.Context, pod *corev1.Pod, m *metricBody) {
	if s.NodeStats == nil || pod.Spec.NodeName == "" {
		return
	}
	raw, err := s.NodeStats(ctx, pod.Spec.NodeName)
	if err != nil {
		s.Log.Error(err, "e2b metrics: kubelet stats summary", "node", pod.Spec.NodeName)
		return
	}
	var sum statsSummary
	if err := json.Unmarshal(raw, &sum); err != nil {
		s.Log.Error(err, "e2b metrics: decode the stats summary", "node", pod.Spec.NodeName)
		return
	}
	for _, p := range sum.Pods {
		if p.PodRef.Namespace != pod.Namespace || p.PodRef.Name != pod.Name {
			continue
		}
		if p.CPU != nil && p.CPU.UsageNanoCores != nil {
			m.CPUUsedPct = float64(*p.CPU.UsageNanoCores) / float64(m.CPUCount) / 1e7
		}
		if mem := p.Memory; mem != nil {
			m.MemUsed = val(mem.WorkingSetBytes)
			if m.MemTotal == 0 && mem.AvailableBytes != nil {
				m.MemTotal = m.MemUsed + *mem.AvailableBytes
			}
			if u, rss := val(mem.UsageBytes), val(mem.RSSBytes); rss > 0 && u > rss {
				m.MemCache = u - rss
			}
		}
		if d := p.EphemeralStorage; d != nil {
			m.DiskUsed = val(d.UsedBytes)
			if m.DiskTotal == 0 {
				m.DiskTotal = val(d.CapacityBytes)
			}
		}
		return
	}
}

func val(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}
