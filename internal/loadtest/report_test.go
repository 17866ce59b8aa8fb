package loadtest

import (
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// jsonPaths lists every field of t's JSON encoding as a dotted path (slices as name[]).
func jsonPaths(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice && prefix != "" && !strings.HasSuffix(prefix, "[]") {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeOf(time.Time{}) {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		p := name
		if prefix != "" {
			p = prefix + "." + name
		}
		out = append(out, p)
		out = append(out, jsonPaths(f.Type, p)...)
	}
	return out
}

// reportFields is the -json report's schema. Users compare runs by these names: a change here is
// a breaking change, to be made on purpose (and docs/benchmarks.md updated with it).
var reportFields = []string{
	"date",
	"host", "host.cpus", "host.model", "host.mem_total", "host.go", "host.damon",
	"config",
	"startup", "startup.seed_ns", "startup.ready_ns", "startup.synced_ns", "startup.idle_rss_kb", "startup.rss_anon_kb",
	"startup.rss_file_kb", "startup.heap_inuse_kb", "startup.heap_retained_kb", "startup.next_gc_kb", "startup.state_file_kb",
	"startup.threads", "startup.watched",
	"thread_tool", "thread_tool.items", "thread_tool.bytes", "thread_tool.bounded_bytes",
	"thread_tool.first_latency", "thread_tool.first_latency.n", "thread_tool.first_latency.p50_ns", "thread_tool.first_latency.p99_ns", "thread_tool.first_latency.max_ns", "thread_tool.first_latency.mean_ns",
	"thread_tool.first_cpu_per_call_ns", "thread_tool.first_sys_per_call_ns", "thread_tool.first_faults_per_call", "thread_tool.warm", "thread_tool.warm.calls", "thread_tool.warm.gc_cycles", "thread_tool.warm.settled", "thread_tool.warm.wall_ns", "thread_tool.warm.minor_faults", "thread_tool.repeat_cpu_per_call_ns", "thread_tool.first_sources", "thread_tool.sources",
	"thread_tool.latency", "thread_tool.latency.n", "thread_tool.latency.p50_ns", "thread_tool.latency.p99_ns", "thread_tool.latency.max_ns", "thread_tool.latency.mean_ns",
	"thread_tool.direct", "thread_tool.direct.n", "thread_tool.direct.p50_ns", "thread_tool.direct.p99_ns", "thread_tool.direct.max_ns", "thread_tool.direct.mean_ns",
	"thread_tool.usage", "thread_tool.usage.wall_ns", "thread_tool.usage.cpu_ns", "thread_tool.usage.sys_cpu_ns", "thread_tool.usage.minor_faults", "thread_tool.usage.cores", "thread_tool.usage.max_rss_kb", "thread_tool.usage.harness_cores", "thread_tool.usage.loadavg", "thread_tool.usage.harness_cpu_ns", "thread_tool.usage.harness_minor_faults", "thread_tool.usage.harness_gc_cpu_ns", "thread_tool.usage.harness_gc_cycles", "thread_tool.usage.harness_heap_live_kb", "thread_tool.usage.harness_chunks", "thread_tool.usage.harness_wakeups", "thread_tool.usage.harness_clients_cpu_ns", "thread_tool.usage.kdamond_cpu_ns",
	"thread_tool.cpu_per_call_ns",
	"latency", "latency.offered_per_s", "latency.settled_per_s",
	"latency.event_latency", "latency.event_latency.n", "latency.event_latency.p50_ns", "latency.event_latency.p99_ns", "latency.event_latency.max_ns", "latency.event_latency.mean_ns",
	"latency.wake_latency", "latency.wake_latency.n", "latency.wake_latency.p50_ns", "latency.wake_latency.p99_ns", "latency.wake_latency.max_ns", "latency.wake_latency.mean_ns",
	"latency.event_rx_latency", "latency.event_rx_latency.n", "latency.event_rx_latency.p50_ns", "latency.event_rx_latency.p99_ns", "latency.event_rx_latency.max_ns", "latency.event_rx_latency.mean_ns",
	"latency.wake_rx_latency", "latency.wake_rx_latency.n", "latency.wake_rx_latency.p50_ns", "latency.wake_rx_latency.p99_ns", "latency.wake_rx_latency.max_ns", "latency.wake_rx_latency.mean_ns",
	"latency.missing_events", "latency.missing_wakes", "latency.early_wakes", "latency.active_waits",
	"latency.usage", "latency.usage.wall_ns", "latency.usage.cpu_ns", "latency.usage.sys_cpu_ns", "latency.usage.minor_faults", "latency.usage.cores", "latency.usage.max_rss_kb", "latency.usage.harness_cores", "latency.usage.loadavg", "latency.usage.harness_cpu_ns", "latency.usage.harness_minor_faults", "latency.usage.harness_gc_cpu_ns", "latency.usage.harness_gc_cycles", "latency.usage.harness_heap_live_kb", "latency.usage.harness_chunks", "latency.usage.harness_wakeups", "latency.usage.harness_clients_cpu_ns", "latency.usage.kdamond_cpu_ns", "latency.stages", "latency.stages[].name", "latency.stages[].n", "latency.stages[].mean_ns", "latency.stages[].p50_ns", "latency.stages[].p99_ns",
	"latency.skipped", "latency.behind",
	"compare", "compare[].name", "compare[].runs", "compare[].noticed",
	"compare[].time_to_notice", "compare[].time_to_notice.n", "compare[].time_to_notice.p50_ns", "compare[].time_to_notice.p99_ns", "compare[].time_to_notice.max_ns", "compare[].time_to_notice.mean_ns",
	"compare[].http_requests", "compare[].http_requests_per_run", "compare[].by_route", "compare[].notice_ratio", "compare[].requests_ratio",
	"throughput", "throughput.offered_per_s", "throughput.settled_per_s", "throughput.committed_per_s", "throughput.delivered_per_s",
	"throughput.backlog", "throughput.drained_ns", "throughput.left",
	"throughput.event_latency", "throughput.event_latency.n", "throughput.event_latency.p50_ns", "throughput.event_latency.p99_ns", "throughput.event_latency.max_ns", "throughput.event_latency.mean_ns",
	"throughput.dropped", "throughput.skipped", "throughput.behind",
	"throughput.usage", "throughput.usage.wall_ns", "throughput.usage.cpu_ns", "throughput.usage.sys_cpu_ns", "throughput.usage.minor_faults", "throughput.usage.cores", "throughput.usage.max_rss_kb", "throughput.usage.harness_cores", "throughput.usage.loadavg", "throughput.harness_cpu_per_run_ns", "throughput.usage.harness_cpu_ns", "throughput.usage.harness_minor_faults", "throughput.usage.harness_gc_cpu_ns", "throughput.usage.harness_gc_cycles", "throughput.usage.harness_heap_live_kb", "throughput.usage.harness_chunks", "throughput.usage.harness_wakeups", "throughput.usage.harness_clients_cpu_ns", "throughput.usage.kdamond_cpu_ns", "throughput.stages", "throughput.stages[].name", "throughput.stages[].n", "throughput.stages[].mean_ns", "throughput.stages[].p50_ns", "throughput.stages[].p99_ns",
	"outage", "outage.down_ns", "outage.offered_per_s", "outage.threads", "outage.settled", "outage.pending_before", "outage.backlog",
	"outage.commit_wait_ns", "outage.refused", "outage.drained_ns", "outage.drain_per_s", "outage.delivered", "outage.undelivered",
	"outage.threads_checked", "outage.order_violations",
	"outage.usage_down", "outage.usage_down.wall_ns", "outage.usage_down.cpu_ns", "outage.usage_down.sys_cpu_ns", "outage.usage_down.minor_faults", "outage.usage_down.cores", "outage.usage_down.max_rss_kb", "outage.usage_down.harness_cores", "outage.usage_down.loadavg", "outage.usage_down.harness_cpu_ns", "outage.usage_down.harness_minor_faults", "outage.usage_down.harness_gc_cpu_ns", "outage.usage_down.harness_gc_cycles", "outage.usage_down.harness_heap_live_kb", "outage.usage_down.harness_chunks", "outage.usage_down.harness_wakeups", "outage.usage_down.harness_clients_cpu_ns", "outage.usage_down.kdamond_cpu_ns",
	"outage.usage_drain", "outage.usage_drain.wall_ns", "outage.usage_drain.cpu_ns", "outage.usage_drain.sys_cpu_ns", "outage.usage_drain.minor_faults", "outage.usage_drain.cores", "outage.usage_drain.max_rss_kb", "outage.usage_drain.harness_cores", "outage.usage_drain.loadavg", "outage.usage_drain.harness_cpu_ns", "outage.usage_drain.harness_minor_faults", "outage.usage_drain.harness_gc_cpu_ns", "outage.usage_drain.harness_gc_cycles", "outage.usage_drain.harness_heap_live_kb", "outage.usage_drain.harness_chunks", "outage.usage_drain.harness_wakeups", "outage.usage_drain.harness_clients_cpu_ns", "outage.usage_drain.kdamond_cpu_ns",
	"soak", "soak.duration_ns", "soak.offered_per_s", "soak.retention_ns", "soak.prune_interval_ns", "soak.settled", "soak.delivered",
	"soak.threads_churned", "soak.churn_errors", "soak.samples", "soak.samples[].at_ns", "soak.samples[].rss_kb", "soak.samples[].heap_inuse_kb",
	"soak.samples[].goroutines", "soak.samples[].state_file_kb", "soak.samples[].tracked", "soak.samples[].watched", "soak.samples[].pending",
	"soak.samples[].received", "soak.samples[].loadavg", "soak.warm_up_ns", "soak.rss_growth", "soak.heap_growth", "soak.state_file_growth",
	"soak.tracked_growth", "soak.flat", "soak.usage", "soak.usage.wall_ns", "soak.usage.cpu_ns", "soak.usage.sys_cpu_ns", "soak.usage.minor_faults", "soak.usage.cores", "soak.usage.max_rss_kb",
	"soak.usage.harness_cores", "soak.usage.loadavg", "soak.usage.harness_cpu_ns", "soak.usage.harness_minor_faults", "soak.usage.harness_gc_cpu_ns", "soak.usage.harness_gc_cycles", "soak.usage.harness_heap_live_kb", "soak.usage.harness_chunks", "soak.usage.harness_wakeups", "soak.usage.harness_clients_cpu_ns", "soak.usage.kdamond_cpu_ns",
	"accounting", "accounting[].phase", "accounting[].settled", "accounting[].delivered", "accounting[].pending", "accounting[].lost",
	"receiver", "receiver.distinct", "receiver.duplicates", "receiver.bad", "receiver.refused", "receiver.connections",
	"peak_rss_kb", "total_cpu_ns", "elapsed_ns", "warnings",
}

// TestReportFieldsStable fails when a field of the -json report is renamed, removed or added
// without updating reportFields (and the table in docs/benchmarks.md, checked below).
func TestReportFieldsStable(t *testing.T) {
	got := jsonPaths(reflect.TypeOf(Report{}), "")
	for _, p := range reportFields {
		if !slices.Contains(got, p) {
			t.Errorf("the -json report lost %q (renamed or removed? users compare runs by these names)", p)
		}
	}
	for _, p := range got {
		if !slices.Contains(reportFields, p) {
			t.Errorf("the -json report has a new field %q: add it to reportFields and to docs/benchmarks.md", p)
		}
	}
}

// TestReportFieldsDocumented checks that docs/benchmarks.md names every JSON key of the report.
func TestReportFieldsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range reportFields {
		key := p[strings.LastIndex(p, ".")+1:]
		key = strings.TrimSuffix(key, "[]")
		if seen[key] {
			continue
		}
		seen[key] = true
		if !strings.Contains(string(doc), "`"+key+"`") {
			t.Errorf("docs/benchmarks.md does not document the report field `%s` (%s)", key, p)
		}
	}
}

// readGC counts the harness's collections: a forced one shows as a cycle, with the live heap
// it found and GC CPU not going backwards.
func TestReadGCCountsCollections(t *testing.T) {
	before := readGC()
	keep := make([][]byte, 0, 64)
	for range 64 {
		keep = append(keep, make([]byte, 64<<10))
	}
	runtime.GC()
	after := readGC()
	runtime.KeepAlive(keep)
	if after.cycles <= before.cycles || after.liveKB < 4<<10 || after.cpu < before.cpu {
		t.Errorf("before %+v, after a forced GC with 4 MiB live %+v", before, after)
	}
}
