package loadtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// connector is the real t3code-mcp binary running `serve` as a child process.
type connector struct {
	cmd  *exec.Cmd
	pid  int
	base string // http://127.0.0.1:<port>
	log  *os.File
	http *http.Client
	exit chan error

	rssMaxKB   atomic.Int64
	stopSample chan struct{}
	sampleDone chan struct{}

	stopInProcess func() error // set when the connector runs inside the harness
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on Linux.
const clockTicks = 100

// TokenEnv is the variable holding the fakes' shared bearer token in the connector's environment.
const TokenEnv = "T3_LOAD_TOKEN"

// writeConfig writes t3code.toml with one table per machine, with compression as its
// `compression` key unless empty (Config.Compression).
func writeConfig(path string, machines []*machine, compression string) error {
	var b strings.Builder
	for _, m := range machines {
		fmt.Fprintf(&b, "[machines.%s]\nurl = %q\ntoken_env = %q\nprojects = [\"*\"]\n", m.name, m.fk.URL(), TokenEnv)
		if compression != "" {
			fmt.Fprintf(&b, "compression = %q\n", compression)
		}
		b.WriteString("\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startConnector runs `bin serve` with env added to a minimal environment.
func startConnector(bin, dir string, env []string) (*connector, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "connector.log"))
	if err != nil {
		return nil, err
	}
	if strings.ContainsRune(bin, filepath.Separator) {
		// The child runs in dir: a relative path such as ./t3code-mcp is the caller's.
		if abs, err := filepath.Abs(bin); err == nil {
			bin = abs
		}
	}
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"T3CODE_MCP_HOST=127.0.0.1",
		"T3CODE_MCP_PORT=" + strconv.Itoa(port),
	}, env...)
	cmd.Stdout = io.Discard
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	c := &connector{
		cmd: cmd, pid: cmd.Process.Pid, base: fmt.Sprintf("http://127.0.0.1:%d", port), log: logf,
		http:       &http.Client{Timeout: 30 * time.Second},
		exit:       make(chan error, 1),
		stopSample: make(chan struct{}), sampleDone: make(chan struct{}),
	}
	go func() { c.exit <- cmd.Wait() }()
	go c.sample()
	return c, nil
}

// sample keeps the highest VmRSS seen, every 100 ms (VmHWM is the kernel's own peak).
func (c *connector) sample() {
	defer close(c.sampleDone)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if rss, _, err := c.memory(); err == nil && rss > c.rssMaxKB.Load() {
			c.rssMaxKB.Store(rss)
		}
		select {
		case <-c.stopSample:
			return
		case <-t.C:
		}
	}
}

// resetRSSMax starts a new peak window for the sampler and returns the old peak.
func (c *connector) resetRSSMax() int64 {
	rss, _, _ := c.memory()
	return c.rssMaxKB.Swap(rss)
}

// memory reads VmRSS and VmHWM (kB) from /proc/<pid>/status.
func (c *connector) memory() (rss, hwm int64, err error) {
	st, err := c.status()
	return st["VmRSS"], st["VmHWM"], err
}

// status reads the kB lines of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, RssFile, …).
func (c *connector) status() (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		v = strings.TrimSpace(v)
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}

// cpu reads the connector's utime+stime.
func (c *connector) cpu() (time.Duration, error) {
	t, err := c.times()
	return t.cpu, err
}

// times reads the connector's utime+stime and stime alone.
func (c *connector) times() (procTimes, error) { return procStat(c.pid) }

// procTimes is what the harness reads from a /proc/<pid>/stat: utime+stime (cpu), stime alone
// (sys: the kernel's work for the process, its socket reads and writes, poller and futex
// wake-ups, page faults), and the minor page faults.
type procTimes struct {
	cpu, sys time.Duration
	minflt   int64
}

// procStat reads procTimes from /proc/<pid>/stat.
func procStat(pid int) (procTimes, error) {
	return procStatFile(fmt.Sprintf("/proc/%d/stat", pid))
}

// procStatFile is procStat of the stat file at path (a process's or a thread's).
func procStatFile(path string) (procTimes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procTimes{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces: split after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, errors.New("malformed /proc/pid/stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); minflt is field 10, utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return procTimes{}, errors.New("short /proc/pid/stat")
	}
	mf, err0 := strconv.ParseInt(f[7], 10, 64)
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err0, err1, err2); err != nil {
		return procTimes{}, err
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }
	return procTimes{cpu: tick(ut + st), sys: tick(st), minflt: mf}, nil
}

type healthBody struct {
	OK       bool `json:"ok"`
	Machines []struct {
		Name   string `json:"name"`
		Online bool   `json:"online"`
	} `json:"machines"`
	Events struct {
		Enabled bool `json:"enabled"`
		Pending int  `json:"pending"`
		Dead    int  `json:"dead_letters"`
		// Lookups: watched threads whose events wait for a read of T3 (this replica's
		// machines only: each replica looks up the machines whose lease it holds).
		Lookups int `json:"threads_awaiting_lookup"`
	} `json:"events"`
}

func (c *connector) health(ctx context.Context) (healthBody, error) {
	var h healthBody
	body, err := c.get(ctx, "/healthz")
	if err != nil {
		return h, err
	}
	defer body.Close()
	return h, json.NewDecoder(body).Decode(&h)
}

// get GETs one of the connector's own routes; the caller closes the body.
func (c *connector) get(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	return res.Body, nil
}

// waitReady polls /healthz until every machine is online; it fails early when the process exits.
func (c *connector) waitReady(ctx context.Context, machines int) error {
	for {
		h, err := c.health(ctx)
		if err == nil && h.OK && len(h.Machines) == machines {
			return nil
		}
		select {
		case err := <-c.exit:
			c.exit <- err
			return fmt.Errorf("the connector exited during start-up (%v); see %s", err, c.log.Name())
		case <-ctx.Done():
			return fmt.Errorf("the connector was not ready: %w (last /healthz: %+v, %v)", ctx.Err(), h, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// metric scrapes one unlabelled series from /metrics.
func (c *connector) metric(ctx context.Context, name string) (float64, error) {
	m, err := c.metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("/metrics has no %s", name)
	}
	return v, nil
}

// metrics scrapes every unlabelled gauge, counter and untyped series from /metrics (parsed by
// prometheus/common's expfmt, like the stage histograms).
func (c *connector) metrics(ctx context.Context) (map[string]float64, error) {
	body, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch fam.GetType() {
			case dto.MetricType_GAUGE:
				out[name] = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_UNTYPED:
				out[name] = m.GetUntyped().GetValue()
			case dto.MetricType_SUMMARY: // its count, as the text format names it
				out[name+"_count"] = float64(m.GetSummary().GetSampleCount())
			}
		}
	}
	return out, nil
}

// counterBy scrapes the counter name from /metrics, by the value of its label (found false
// when the connector has no such counter).
func (c *connector) counterBy(ctx context.Context, name, label string) (by map[string]float64, found bool, err error) {
	body, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, false, err
	}
	defer body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return nil, false, err
	}
	fam, found := families[name]
	if !found || fam.GetType() != dto.MetricType_COUNTER {
		return nil, false, nil
	}
	by = map[string]float64{}
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				by[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return by, true, nil
}

// stop sends SIGTERM and waits (SIGKILL after 10 s).
func (c *connector) stop() error {
	var once sync.Once
	stopSampler := func() { once.Do(func() { close(c.stopSample); <-c.sampleDone }) }
	stopSampler()
	defer c.log.Close()
	if c.stopInProcess != nil {
		return c.stopInProcess()
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exit:
		return exitErr(err)
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exit
		return errors.New("the connector did not stop within 10s of SIGTERM; killed")
	}
}

func exitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() && ee.ExitCode() == 0 {
		return nil
	}
	return err
}
