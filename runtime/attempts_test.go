package runtime

import (
	"reflect"
	"sync"
	"testing"
)

// Attempts are counted by kind and syscall, concurrently, and taken once.
func TestAttemptsTake(t *testing.T) {
	var a Attempts
	if got := a.Take(); got != nil {
		t.Fatalf("empty Take = %v, want nil", got)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Add("mount", "mount")
			a.Add("kernel", "bpf")
		}()
	}
	wg.Wait()
	a.Add("kernel", "keyctl")
	want := []Attempt{{"kernel", "bpf", 10}, {"kernel", "keyctl", 1}, {"mount", "mount", 10}}
	if got := a.Take(); !reflect.DeepEqual(got, want) {
		t.Errorf("Take = %v, want %v", got, want)
	}
	if got := a.Take(); got != nil {
		t.Errorf("second Take = %v, want nil: taking starts afresh", got)
	}
}
