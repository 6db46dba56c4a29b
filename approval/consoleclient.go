package approval

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ConsoleClient speaks the console's JSON API, as `airlock approvals` does.
type ConsoleClient struct {
	// URL is the console's base URL, e.g. http://127.0.0.1:8766.
	URL   string
	Token string
	HTTP  *http.Client
}

func (c *ConsoleClient) do(ctx context.Context, method, path string, out any) error {
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("approval console at %s: %w (is `airlock serve` running with approval.mode set?)", c.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		return &ConsoleError{Status: resp.StatusCode, Msg: e.Error}
	}
	return json.Unmarshal(body, out)
}

// ConsoleError is a refusal from the console API.
type ConsoleError struct {
	Status int
	Msg    string
}

func (e *ConsoleError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status) }

// List returns the pending and recent requests.
func (c *ConsoleClient) List(ctx context.Context) (Requests, error) {
	var r Requests
	err := c.do(ctx, http.MethodGet, "/api/requests", &r)
	return r, err
}

// Decide approves or denies the pending request id.
func (c *ConsoleClient) Decide(ctx context.Context, id string, approve bool) error {
	verdict := "deny"
	if approve {
		verdict = "approve"
	}
	var out map[string]any
	return c.do(ctx, http.MethodPost, "/api/requests/"+url.PathEscape(id)+"/"+verdict, &out)
}
