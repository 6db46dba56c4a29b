package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
)

// Client asks a node's agent what a container tried.
type Client struct {
	// Base is the agent's URL, e.g. http://10.0.0.5:9477.
	Base  string
	Token string
	// HTTP defaults to a client without a timeout (streams last a run);
	// every call takes a context.
	HTTP *http.Client
}

func (c *Client) do(ctx context.Context, method, id, what string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+"/v1/containers/"+url.PathEscape(id)+"/"+what, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("monitor agent %s: %s: %s", c.Base, resp.Status, b)
	}
	return resp, nil
}

// Take returns the container's attempts since the last take.
func (c *Client) Take(ctx context.Context, id string) (TakeResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout+5*time.Second)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, id, "take")
	if err != nil {
		return TakeResponse{}, err
	}
	defer resp.Body.Close()
	var tr TakeResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&tr); err != nil {
		return TakeResponse{}, fmt.Errorf("monitor agent %s: take: %w", c.Base, err)
	}
	if tr.Attempts == nil {
		tr.Attempts = []runtime.Attempt{}
	}
	return tr, nil
}

// Watch calls fn for each attempt of the container as it happens, until
// ctx ends or the stream breaks (the error says why; nil when ctx ended).
// ready is closed once the agent has the stream open, so nothing after it
// is missed.
func (c *Client) Watch(ctx context.Context, id string, ready chan<- struct{}, fn func(StreamEvent)) error {
	resp, err := c.do(ctx, http.MethodGet, id, "events")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ready != nil {
		close(ready)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		var e StreamEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			fn(e)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("monitor agent %s: events: %w", c.Base, err)
	}
	return fmt.Errorf("monitor agent %s: the event stream ended", c.Base)
}
