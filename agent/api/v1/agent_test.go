package agentapi

import (
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestCreateContainerRoundTrip(t *testing.T) {
	in := &CreateContainerRequest{
		Id: "c1", SpecJson: []byte(`{"ociVersion":"1.2.0"}`),
		Rootfs: &Rootfs{Serial: "rootfs0", Fstype: "ext4", Options: []string{"rw", "noatime"}},
		Files:  []*File{{Path: "/etc/hosts", Content: []byte("127.0.0.1 x\n"), Mode: 0o644}},
		Stdout: true, Stderr: true, Terminal: false,
	}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out CreateContainerRequest
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, &out) {
		t.Fatalf("round trip changed the message:\n%v\n%v", in, &out)
	}
}

// Stats carries cgroup2 metrics in an Any that containerd can decode as is.
func TestStatsAny(t *testing.T) {
	m := &stats.Metrics{Memory: &stats.MemoryStat{Usage: 4096}, Pids: &stats.PidsStat{Current: 2}}
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&StatsResponse{Metrics: a})
	if err != nil {
		t.Fatal(err)
	}
	var resp StatsResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Metrics.TypeUrl != "type.googleapis.com/io.containerd.cgroups.v2.Metrics" {
		t.Errorf("type url %q", resp.Metrics.TypeUrl)
	}
	var got stats.Metrics
	if err := resp.Metrics.UnmarshalTo(&got); err != nil {
		t.Fatal(err)
	}
	if got.Memory.Usage != 4096 || got.Pids.Current != 2 {
		t.Fatalf("metrics %v", &got)
	}
}
