//! Prometheus metrics, fed from the Host's [`Event`]s and served at `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use tokenwire_core::{Dialect, Event, Outcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DialectLabels {
    dialect: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FilterLabels {
    dialect: &'static str,
    rule: String,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    dialect: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    dialect: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RatingLabels {
    rating: &'static str,
}

/// The server's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    connections: Family<DialectLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    http: Family<HttpLabels, Counter>,
    filtered: Family<FilterLabels, Counter>,
    queue_depth: Gauge,
    running: Gauge,
    kv_used: Gauge,
    kv_kept: Gauge,
    kv_cached: Gauge,
    prefix_queries: Counter,
    draft_tokens: Counter,
    draft_accepted: Counter,
    prefix_hits: Counter,
    kv_capacity: Gauge,
    tokens: Counter,
    prompt_reused: Counter,
    prompt_tokens: Counter,
    completion_tokens: Counter,
    ttft: Histogram,
    inter_token: Histogram,
    e2e: Histogram,
    handle: Histogram,
    kv_usage: Gauge<f64, AtomicU64>,
    feedback: Family<RatingLabels, Counter>,
    overflows: Counter,
    refused: Counter,
}

/// Metric family names, as in the exposition's `# TYPE` lines (counters' samples
/// carry a `_total` suffix, histograms' `_bucket`, `_sum` and `_count`).
pub const METRIC_NAMES: &[&str] = &[
    "tokenwire_connections",
    "tokenwire_requests",
    "tokenwire_errors",
    "tokenwire_http_requests",
    "tokenwire_queue_depth",
    "tokenwire_running_sequences",
    "tokenwire_kv_blocks_used",
    "tokenwire_kv_blocks_kept",
    "tokenwire_kv_blocks_capacity",
    "tokenwire_kv_blocks_cached",
    "tokenwire_prefix_cache_queries",
    "tokenwire_prefix_cache_hits",
    "tokenwire_draft_tokens",
    "tokenwire_draft_tokens_accepted",
    "tokenwire_prompt_tokens_reused",
    "tokenwire_tokens_generated",
    "tokenwire_prompt_tokens",
    "tokenwire_completion_tokens",
    "tokenwire_time_to_first_token_seconds",
    "tokenwire_inter_token_latency_seconds",
    "tokenwire_e2e_request_latency_seconds",
    "tokenwire_kv_cache_usage_ratio",
    "tokenwire_feedback",
    "tokenwire_outbound_queue_overflows",
    "tokenwire_connections_refused",
    "tokenwire_host_handle_duration_seconds",
];

const OUTCOMES: [Outcome; 4] = [
    Outcome::Completed,
    Outcome::Cancelled,
    Outcome::TimedOut,
    Outcome::Failed,
];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Fresh metrics, registered under the `tokenwire_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tokenwire");
        let connections = Family::<DialectLabels, Gauge>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let http = Family::<HttpLabels, Counter>::default();
        let filtered = Family::<FilterLabels, Counter>::default();
        let feedback = Family::<RatingLabels, Counter>::default();
        let queue_depth = Gauge::default();
        let running = Gauge::default();
        let kv_used = Gauge::default();
        let kv_kept = Gauge::default();
        let kv_cached = Gauge::default();
        let prefix_queries = Counter::default();
        let draft_tokens = Counter::default();
        let draft_accepted = Counter::default();
        let prefix_hits = Counter::default();
        let prompt_reused = Counter::default();
        let kv_capacity = Gauge::default();
        let tokens = Counter::default();
        let prompt_tokens = Counter::default();
        let completion_tokens = Counter::default();
        let overflows = Counter::default();
        let refused = Counter::default();
        let ttft = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let inter_token = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        // 10 ms to about 5.8 min: a request lasts as long as its stream.
        let e2e = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        let kv_usage = Gauge::<f64, AtomicU64>::default();
        // 10 µs to about 0.33 s: what one input holds the driver for.
        let handle = Histogram::new(exponential_buckets(0.000_01, 2.0, 16));

        // Series that read 0 rather than being absent (an empty family is not
        // exposed at all).
        let _ = http.get_or_create(&HttpLabels {
            route: "/health".into(),
            status: 200,
        });
        for rating in ["positive", "neutral", "negative"] {
            let _ = feedback.get_or_create(&RatingLabels { rating });
        }
        for d in Dialect::ALL {
            let _ = connections.get_or_create(&DialectLabels { dialect: d.name() });
            let _ = errors.get_or_create(&ErrorLabels {
                dialect: d.name(),
                code: "invalid_request",
            });
            for o in OUTCOMES {
                let _ = requests.get_or_create(&RequestLabels {
                    dialect: d.name(),
                    outcome: o.name(),
                });
            }
        }

        registry.register(
            "connections",
            "Open connections by dialect",
            connections.clone(),
        );
        registry.register(
            "requests",
            "Finished requests by dialect and outcome",
            requests.clone(),
        );
        registry.register(
            "errors",
            "Error frames sent, by dialect and error code",
            errors.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by route (the route's pattern; WebSocket upgrades by their path; `other` for no route) and status",
            http.clone(),
        );
        registry.register(
            "content_filtered",
            "Requests refused and generations stopped by a content-filter rule, by dialect, rule name and action",
            filtered.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for admission",
            queue_depth.clone(),
        );
        registry.register(
            "running_sequences",
            "Sequences holding KV blocks and being computed",
            running.clone(),
        );
        registry.register("kv_blocks_used", "KV cache blocks in use", kv_used.clone());
        registry.register(
            "kv_blocks_kept",
            "KV cache blocks in use only to continue finished batches (freed first under memory pressure)",
            kv_kept.clone(),
        );
        registry.register(
            "kv_blocks_cached",
            "KV cache blocks no request holds, kept for their content (prefix caching); reused by prompts that start the same way, evicted least recently used first when memory is needed",
            kv_cached.clone(),
        );
        registry.register(
            "prefix_cache_queries",
            "Prompt tokens of admitted requests looked up in the prefix cache",
            prefix_queries.clone(),
        );
        registry.register(
            "prefix_cache_hits",
            "Prompt tokens whose KV blocks came from the prefix cache instead of being computed",
            prefix_hits.clone(),
        );
        registry.register(
            "draft_tokens",
            "Draft tokens fed to the engine by speculative decoding (prompt lookup, --draft-tokens)",
            draft_tokens.clone(),
        );
        registry.register(
            "draft_tokens_accepted",
            "Draft tokens the engine's samples confirmed: tokens generated beyond one per sequence and step",
            draft_accepted.clone(),
        );
        registry.register(
            "prompt_tokens_reused",
            "Prompt tokens of batch continuations whose KV blocks were kept from the earlier generation instead of computed",
            prompt_reused.clone(),
        );
        registry.register(
            "kv_blocks_capacity",
            "KV cache blocks in the pool",
            kv_capacity.clone(),
        );
        registry.register(
            "tokens_generated",
            "Tokens generated, over all requests",
            tokens.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            prompt_tokens.clone(),
        );
        registry.register(
            "completion_tokens",
            "Generated tokens of finished requests",
            completion_tokens.clone(),
        );
        registry.register_with_unit(
            "time_to_first_token",
            "Time from a request's arrival to its first token",
            Unit::Seconds,
            ttft.clone(),
        );
        registry.register_with_unit(
            "inter_token_latency",
            "Time between two tokens of one request",
            Unit::Seconds,
            inter_token.clone(),
        );
        registry.register_with_unit(
            "e2e_request_latency",
            "Time from a request's arrival to its end, whatever the outcome",
            Unit::Seconds,
            e2e.clone(),
        );
        registry.register_with_unit(
            "host_handle_duration",
            "Time the driver spent on one input: Host::handle and routing its outputs (no other connection is served meanwhile)",
            Unit::Seconds,
            handle.clone(),
        );
        registry.register(
            "kv_cache_usage_ratio",
            "Fraction of the KV cache's blocks in use (0 to 1)",
            kv_usage.clone(),
        );
        registry.register(
            "feedback",
            "Client feedback messages by rating sign",
            feedback.clone(),
        );
        registry.register(
            "outbound_queue_overflows",
            "Connections closed because their outbound queue overflowed",
            overflows.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections answered 503 because the connection limit was reached",
            refused.clone(),
        );

        Metrics {
            registry,
            connections,
            requests,
            errors,
            http,
            filtered,
            queue_depth,
            running,
            kv_used,
            kv_kept,
            kv_cached,
            prefix_queries,
            draft_tokens,
            draft_accepted,
            prefix_hits,
            kv_capacity,
            tokens,
            prompt_reused,
            prompt_tokens,
            completion_tokens,
            ttft,
            inter_token,
            e2e,
            handle,
            kv_usage,
            feedback,
            overflows,
            refused,
        }
    }

    /// Records how long one input held the driver.
    pub fn observe_handle(&self, d: std::time::Duration) {
        self.handle.observe(d.as_secs_f64());
    }

    /// Records one Host event.
    pub fn observe(&self, event: &Event) {
        match event {
            Event::ConnectionOpened { dialect } => {
                self.connections
                    .get_or_create(&DialectLabels {
                        dialect: dialect.name(),
                    })
                    .inc();
            }
            Event::ConnectionClosed { dialect } => {
                self.connections
                    .get_or_create(&DialectLabels {
                        dialect: dialect.name(),
                    })
                    .dec();
            }
            Event::RequestFinished {
                dialect,
                outcome,
                prompt_tokens,
                completion_tokens,
                elapsed,
                ..
            } => {
                self.e2e.observe(elapsed.as_secs_f64());
                self.requests
                    .get_or_create(&RequestLabels {
                        dialect: dialect.name(),
                        outcome: outcome.name(),
                    })
                    .inc();
                self.prompt_tokens.inc_by(u64::from(*prompt_tokens));
                self.completion_tokens.inc_by(u64::from(*completion_tokens));
            }
            Event::FirstToken { ttft } => self.ttft.observe(ttft.as_secs_f64()),
            Event::InterToken { gap } => self.inter_token.observe(gap.as_secs_f64()),
            Event::Error { dialect, code } => {
                self.errors
                    .get_or_create(&ErrorLabels {
                        dialect: dialect.name(),
                        code,
                    })
                    .inc();
            }
            Event::ContentFiltered {
                dialect,
                rule,
                action,
            } => {
                self.filtered
                    .get_or_create(&FilterLabels {
                        dialect: dialect.name(),
                        rule: rule.clone(),
                        action: action.as_str(),
                    })
                    .inc();
            }
            // Logged by the driver; nothing to count.
            Event::ConnectionNamed { .. } | Event::RequestStarted { .. } => {}
            Event::FeedbackReceived { rating } => {
                let rating = if *rating > 0.0 {
                    "positive"
                } else if *rating < 0.0 {
                    "negative"
                } else {
                    "neutral"
                };
                self.feedback.get_or_create(&RatingLabels { rating }).inc();
            }
            Event::Gauges {
                queued,
                running,
                kv_blocks_used,
                kv_blocks_kept,
                kv_blocks_total,
                kv_blocks_cached,
            } => {
                self.kv_cached.set(i64::from(*kv_blocks_cached));
                self.queue_depth.set(i64::from(*queued));
                self.running.set(i64::from(*running));
                self.kv_used.set(i64::from(*kv_blocks_used));
                self.kv_kept.set(i64::from(*kv_blocks_kept));
                self.kv_capacity.set(i64::from(*kv_blocks_total));
                self.kv_usage.set(if *kv_blocks_total == 0 {
                    0.0
                } else {
                    f64::from(*kv_blocks_used) / f64::from(*kv_blocks_total)
                });
            }
            Event::TokensGenerated { count } => {
                self.tokens.inc_by(u64::from(*count));
            }
            Event::PromptTokensReused { count } => {
                self.prompt_reused.inc_by(u64::from(*count));
            }
            Event::DraftTokens { drafted, confirmed } => {
                self.draft_tokens.inc_by(u64::from(*drafted));
                self.draft_accepted.inc_by(u64::from(*confirmed));
            }
            Event::PrefixCacheLookup { queried, hit } => {
                self.prefix_queries.inc_by(u64::from(*queried));
                self.prefix_hits.inc_by(u64::from(*hit));
            }
        }
    }

    /// Counts one HTTP request answered with `status` on `route` (a
    /// pattern from a bounded set, never a client's raw path).
    pub fn http_request(&self, route: String, status: u16) {
        self.http.get_or_create(&HttpLabels { route, status }).inc();
    }

    /// Counts a connection closed by the shell because its queue overflowed.
    pub fn outbound_overflow(&self) {
        self.overflows.inc();
    }

    /// Counts a connection refused at accept (the connection limit).
    pub fn connection_refused(&self) {
        self.refused.inc();
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            // Writing to a String cannot fail; keep whatever was written.
            out.push_str("# EOF\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_metric_name_is_exposed() {
        let m = Metrics::new();
        let text = m.encode();
        for name in METRIC_NAMES {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing from:\n{text}"
            );
        }
    }

    /// The dashboard in `docs/` queries only series this server exposes.
    #[test]
    fn the_grafana_dashboard_uses_only_exposed_series() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/grafana-dashboard.json"
        );
        let dash: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).expect("dashboard")).expect("JSON");
        let exprs: Vec<String> = dash["panels"]
            .as_array()
            .expect("panels")
            .iter()
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t["expr"].as_str().map(str::to_owned))
            .collect();
        assert!(exprs.len() >= 10, "{exprs:?}");
        let exposed = |series: &str| {
            let family = ["_bucket", "_total", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s))
                .unwrap_or(series);
            METRIC_NAMES.contains(&family)
        };
        for expr in &exprs {
            let mut rest = expr.as_str();
            let mut found = 0;
            while let Some(at) = rest.find("tokenwire_") {
                let series: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(exposed(&series), "{series} (in {expr}) is not exposed");
                found += 1;
                rest = &rest[at + series.len()..];
            }
            assert!(found > 0, "{expr} reads no tokenwire series");
        }
    }

    #[test]
    fn events_move_the_metrics() {
        let m = Metrics::new();
        m.observe(&Event::ConnectionOpened {
            dialect: Dialect::Generate,
        });
        m.observe(&Event::RequestFinished {
            dialect: Dialect::Generate,
            request: 1,
            outcome: Outcome::Completed,
            prompt_tokens: 3,
            completion_tokens: 5,
            elapsed: Duration::from_millis(1500),
        });
        m.observe(&Event::Error {
            dialect: Dialect::Batch,
            code: "invalid_request",
        });
        m.observe(&Event::Gauges {
            queued: 2,
            running: 1,
            kv_blocks_used: 4,
            kv_blocks_kept: 3,
            kv_blocks_total: 64,
            kv_blocks_cached: 5,
        });
        m.observe(&Event::PrefixCacheLookup {
            queried: 40,
            hit: 32,
        });
        m.observe(&Event::TokensGenerated { count: 7 });
        m.observe(&Event::PromptTokensReused { count: 11 });
        m.observe(&Event::FirstToken {
            ttft: Duration::from_millis(20),
        });
        let text = m.encode();
        assert!(
            text.contains("tokenwire_connections{dialect=\"generate\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tokenwire_requests_total{dialect=\"generate\",outcome=\"completed\"} 1")
        );
        assert!(
            text.contains("tokenwire_errors_total{dialect=\"batch\",code=\"invalid_request\"} 1")
        );
        assert!(text.contains("tokenwire_kv_blocks_capacity 64"));
        assert!(text.contains("tokenwire_tokens_generated_total 7"));
        assert!(text.contains("tokenwire_kv_blocks_kept 3"), "{text}");
        assert!(text.contains("tokenwire_prompt_tokens_reused_total 11"));
        assert!(text.contains("tokenwire_kv_blocks_cached 5"), "{text}");
        assert!(
            text.contains("tokenwire_prefix_cache_queries_total 40"),
            "{text}"
        );
        assert!(
            text.contains("tokenwire_prefix_cache_hits_total 32"),
            "{text}"
        );
        assert!(text.contains("tokenwire_time_to_first_token_seconds_count 1"));
        assert!(
            text.contains("tokenwire_e2e_request_latency_seconds_sum 1.5"),
            "{text}"
        );
        assert!(
            text.contains("tokenwire_kv_cache_usage_ratio 0.0625"),
            "{text}"
        );
    }
}
