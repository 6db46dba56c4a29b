package tools

import "context"

type lifetimeKey struct{}

// WithLifetime returns ctx carrying done: a transport whose calls outlive
// their request's context (legacy SSE answers on another connection) closes
// done when the client's session ends, and calls still going are cancelled.
func WithLifetime(ctx context.Context, done <-chan struct{}) context.Context {
	return context.WithValue(ctx, lifetimeKey{}, done)
}

// errClientGone cancels a call whose client session ended.
var errClientGone = context.Canceled

// bindLifetime cancels ctx when the transport says the client is gone; the
// returned function stops watching.
func bindLifetime(ctx context.Context, cancel context.CancelCauseFunc) func() {
	done, _ := ctx.Value(lifetimeKey{}).(<-chan struct{})
	if done == nil {
		return func() {}
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-done:
			cancel(errClientGone)
		case <-ctx.Done():
		case <-stop:
		}
	}()
	return func() { close(stop) }
}
