package runtime

import "sync"

// Teardowns are sandboxes being destroyed after their call answered: the
// answer does not wait for the teardown, but the call's admission slot
// does, so a finished call's sandbox counts until it is gone.
type Teardowns struct{ wg sync.WaitGroup }

// Start destroys a sandbox in the background and then releases what the
// call held (its slot; nil for none).
func (t *Teardowns) Start(destroy func(), release func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if release != nil {
			defer release()
		}
		destroy()
	}()
}

// Wait waits until every teardown started has finished.
func (t *Teardowns) Wait() { t.wg.Wait() }
