package bootid

import (
	"os"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	id, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(b)); id != want {
		t.Fatalf("Get() = %q, %s holds %q", id, path, want)
	}
	if again, _ := Get(); again != id {
		t.Fatalf("second Get() = %q, first %q", again, id)
	}
}
