package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// healthcheck asks the serve on T3CODE_MCP_HOST/T3CODE_MCP_PORT for /healthz
// and exits 0 on HTTP 200: the container HEALTHCHECK (distroless images have
// no curl). A listen address of 0.0.0.0 or :: is asked on loopback. /healthz
// answers 200 while the server runs, whether or not the machines are online:
// an offline machine is not fixed by restarting the connector.
func (c *cli) healthcheck(ctx context.Context) error {
	stdout, stderr := c.stdout, c.stderr
	s, err := c.settings()
	if err != nil {
		return err
	}
	host := s.Host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	u := "http://" + net.JoinHostPort(host, strconv.Itoa(s.Port)) + "/healthz"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintf(stderr, "unhealthy: %v\n", err)
		return exitFailed
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "unhealthy: %s does not answer: %v\n", u, netCause(err))
		return exitFailed
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "unhealthy: %s answered HTTP %d\n", u, resp.StatusCode)
		return exitFailed
	}
	fmt.Fprintf(stdout, "healthy: %s answered HTTP 200\n", u)
	return nil
}
