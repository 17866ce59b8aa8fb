package loadtest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
)

// startInProcess runs the connector inside the harness (app.New, its handler on a 127.0.0.1
// listener, app.Run): the same code as the binary's `serve`, but profilable with the harness's
// -cpuprofile, -blockprofile and -memprofile. Its CPU and memory figures include the harness and
// the fakes (they read /proc/self), so the reported numbers come from binary runs only.
func startInProcess(dir string, env []string) (*connector, error) {
	vals := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	// The machines' token_env is read from the process environment.
	if err := os.Setenv(TokenEnv, vals[TokenEnv]); err != nil {
		return nil, err
	}
	s, err := app.SettingsFromEnv(func(k string) string { return vals[k] })
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "connector.log"))
	if err != nil {
		return nil, err
	}
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(vals["T3CODE_MCP_LOG_LEVEL"]))
	a, err := app.New(s, app.Options{Logger: slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		logf.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.Close()
		logf.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := &http.Server{Handler: a.Handler, ReadHeaderTimeout: 10 * time.Second}
	ran := make(chan struct{})
	go func() { defer close(ran); a.Run(ctx) }()
	go func() { _ = srv.Serve(ln) }()
	c := &connector{
		pid: os.Getpid(), base: "http://" + ln.Addr().String(), log: logf,
		http: &http.Client{Timeout: 10 * time.Second}, exit: make(chan error, 1),
		stopSample: make(chan struct{}), sampleDone: make(chan struct{}),
	}
	c.stopInProcess = func() error {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		err := srv.Shutdown(sctx)
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			err = fmt.Errorf("the in-process connector did not stop within 10s")
		}
		a.Close()
		return err
	}
	go c.sample()
	return c, nil
}
