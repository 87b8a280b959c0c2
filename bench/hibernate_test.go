package bench

import (
	"fmt"
	"testing"
)

// TestHibernateTargets: the loop's targets read its rows and fail on the
// worst generation.
func TestHibernateTargets(t *testing.T) {
	rows := func(up5, pause5, restore5 float64) *runner {
		r := &runner{r: &Report{}}
		r.r.add("hibernate", "booted_pause", "ms", 100)
		for g := 1; g <= hibernateGens; g++ {
			up, pause, restore := 1.05, 90.0, 300.0
			if g == hibernateGens {
				up, pause, restore = up5, pause5, restore5
			}
			p := fmt.Sprintf("gen%d_", g)
			r.r.add("hibernate", p+"uploaded_per_changed_byte", "ratio", up)
			r.r.add("hibernate", p+"pause", "ms", pause)
			r.r.add("hibernate", p+"restore_to_exec", "ms", restore)
		}
		r.hibernateTargets()
		return r
	}
	pass := func(r *runner) []bool {
		var out []bool
		for _, x := range r.r.Targets {
			out = append(out, x.Pass)
		}
		return out
	}
	if got := pass(rows(1.1, 110, 320)); fmt.Sprint(got) != "[true true true]" {
		t.Errorf("all within the targets: %v", got)
	}
	if got := pass(rows(2.5, 130, 400)); fmt.Sprint(got) != "[false false false]" {
		t.Errorf("generation 5 past every target: %v", got)
	}
}
