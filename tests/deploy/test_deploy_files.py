"""The deploy files: Prometheus config and alerts, Grafana dashboard, Kubernetes + KEDA manifests, compose file.

Static checks with real validators (promtool, the Kubernetes and compose
JSON schemas), rule unit tests run by `promtool test rules`, and cross-checks
against the code: metric names against what the exporter serves, stream,
group and queue names against `contracts.keys`, commands against `pvm`'s own
argument parser, settings against `Settings.from_env`.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml
from prometheus_client.core import Metric
from rq import Queue

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.metrics import MetricsRecorder
from workers.ingest.dispatcher import Dispatcher
from workers.ops.cli import build_parser
from workers.ops.exporter import PvmCollector

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "pvm-dashboard.json"
K8S_DIR = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

# The Kubernetes version the manifests are validated against (strict: unknown fields fail).
K8S_VERSION = "1.30"

# Every series the exporter serves: name -> (type, labels). Checked against the
# exporter itself below, so alerts and the dashboard can only query what exists.
METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "pvm_stream_length": ("gauge", frozenset({"shard"})),
    "pvm_stream_lag": ("gauge", frozenset({"shard", "group"})),
    "pvm_stream_pending": ("gauge", frozenset({"shard", "group"})),
    "pvm_stream_oldest_pending_age_seconds": ("gauge", frozenset({"shard", "group"})),
    "pvm_dead_letters": ("gauge", frozenset({"shard"})),
    "pvm_dead_letters_added_total": ("counter", frozenset({"shard"})),
    "pvm_queue_jobs": ("gauge", frozenset({"queue", "pool", "status"})),
    "pvm_queue_workers": ("gauge", frozenset({"queue", "pool"})),
    "pvm_queue_oldest_waiting_seconds": ("gauge", frozenset({"queue", "pool"})),
    "pvm_reaper_requeued_total": ("counter", frozenset({"queue", "reason"})),
    "pvm_stage_minutes_total": ("counter", frozenset({"stage"})),
    "pvm_stage_batches_total": ("counter", frozenset({"stage"})),
    "pvm_stage_failures_total": ("counter", frozenset({"stage"})),
    "pvm_stage_batch_duration_seconds": ("histogram", frozenset({"stage"})),
    "pvm_freshness_seconds": ("histogram", frozenset({"stage"})),
    "pvm_provider_calls_total": ("counter", frozenset({"provider", "kind", "outcome"})),
    "pvm_provider_tokens_total": ("counter", frozenset({"provider", "kind"})),
    "pvm_provider_completion_tokens_total": ("counter", frozenset({"provider", "kind"})),
    "pvm_provider_latency_seconds": ("histogram", frozenset({"provider", "kind"})),
    "pvm_schedule_last_run_timestamp_seconds": ("gauge", frozenset({"schedule"})),
    "pvm_schedule_interval_seconds": ("gauge", frozenset({"schedule"})),
    "pvm_scheduler_leader": ("gauge", frozenset({"scheduler"})),
    "pvm_exporter_scrape_errors_total": ("counter", frozenset()),
    "pvm_facts_changes_total": ("counter", frozenset({"change"})),
    "pvm_summaries_total": ("counter", frozenset({"what"})),
    "pvm_fact_extraction_chunks_total": ("counter", frozenset({"extractor", "outcome"})),
    "pvm_fact_extraction_items_total": ("counter", frozenset({"extractor", "outcome"})),
    "pvm_evaluate_total": ("counter", frozenset({"what"})),
    "pvm_evaluation_last_completed_timestamp_seconds": ("gauge", frozenset({"project"})),
    "pvm_evaluation_progress_ratio": ("gauge", frozenset({"project"})),
}
# Every label the exporter puts on a series.
METRIC_LABELS = frozenset(
    {
        *("shard", "group", "queue", "pool", "stage", "status", "provider", "kind", "outcome", "schedule"),
        *("scheduler", "reason", "change", "extractor", "what", "project"),
    }
)
# Series Prometheus adds itself for every target.
TARGET_LABELS = frozenset({"job", "instance"})
PROMETHEUS_SERIES = {"up": ("gauge", frozenset())}
QUEUE_STATUSES = {"queued", "dequeued", "started", "failed", "deferred", "scheduled", "finished"}

# Metadata fields of KEDA's scalers, as their docs define them:
#   redis-streams: https://keda.sh/docs/2.15/scalers/redis-streams/  ("Trigger Specification", "Parameter list")
#   redis (lists): https://keda.sh/docs/2.15/scalers/redis-lists/    ("Trigger Specification", "Parameter list")
# username/password/tls/ca/cert/key belong in a TriggerAuthentication, not in metadata.
KEDA_REDIS_CONNECTION_METADATA = frozenset(
    {
        "address",
        "host",
        "port",
        "addressFromEnv",
        "hostFromEnv",
        "portFromEnv",
        "usernameFromEnv",
        "passwordFromEnv",
        "enableTLS",
        "unsafeSsl",
        "databaseIndex",
    }
)
KEDA_REDIS_STREAMS_METADATA = KEDA_REDIS_CONNECTION_METADATA | {
    "stream",
    "consumerGroup",
    "pendingEntriesCount",
    "streamLength",
    "lagCount",
    "activationLagCount",
}
KEDA_REDIS_LISTS_METADATA = KEDA_REDIS_CONNECTION_METADATA | {"listName", "listLength", "activationListLength"}
KEDA_TRIGGER_METADATA = {"redis-streams": KEDA_REDIS_STREAMS_METADATA, "redis": KEDA_REDIS_LISTS_METADATA}

# The ScaledObject fields the KEDA docs define (https://keda.sh/docs/2.15/reference/scaledobject-spec/),
# as a JSON schema that refuses anything else.
_INT = {"type": "integer", "minimum": 0}
KEDA_SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": _INT,
                "cooldownPeriod": _INT,
                "initialCooldownPeriod": _INT,
                "idleReplicaCount": _INT,
                "minReplicaCount": _INT,
                "maxReplicaCount": _INT,
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {"failureThreshold": _INT, "replicas": _INT},
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}},
                        },
                        "scalingModifiers": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["target", "formula"],
                            "properties": {
                                "target": {"type": "string"},
                                "activationTarget": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value"]},
                                "formula": {"type": "string"},
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            # KEDA reads metadata as map[string]string: numbers must be quoted.
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "useCachedMetrics": {"type": "boolean"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "authenticationRef": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
    },
}

# Commands the deploy files run that land with later issues: until `pvm` has
# them, they are not parsed (once it has, they are).
LATER_COMMANDS = {"serve"}

# The services of docker-compose.yml beside the pools (one service per pool, named after it).
COMPOSE_SERVICES = {"redis", "qdrant", "dispatcher", "scheduler", "exporter", "api", "prometheus"}


# -- helpers ------------------------------------------------------------------


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if path is None:
        pytest.fail(
            "promtool not found on PATH or at /usr/bin/promtool: install Debian's `prometheus` package "
            "(apt-get install -y --no-install-recommends prometheus; `make test` does this when run as root)"
        )
    return path


def run_promtool(promtool: str, *args: str | Path) -> str:
    result = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(map(str, args))} failed:\n{output}"
    return output


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard_targets() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel, target
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def dashboard_expr_as_promql(expr: str) -> str:
    """A dashboard query with Grafana's interval variables replaced, as Prometheus would receive it."""
    return re.sub(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}", "1m", expr)


def queried_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every alert rule and dashboard query."""
    out = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    out += [
        (f"dashboard panel {p['title']!r} {t['refId']}", dashboard_expr_as_promql(t["expr"]))
        for p, t in dashboard_targets()
    ]
    return out


def series_name(sample: str) -> str:
    """The metric a sample name belongs to: histogram samples map to their histogram."""
    base = re.sub(r"_(bucket|sum|count)$", "", sample)
    if base != sample and METRICS.get(base, ("",))[0] == "histogram":
        return base
    return sample


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in k8s_documents() if doc["kind"] == kind}


def container_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The environment of a Deployment's first container (where KEDA looks), with envFrom resolved."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config_maps, secrets = k8s_objects("ConfigMap"), k8s_objects("Secret")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_maps[source["configMapRef"]["name"]]["data"])
        if "secretRef" in source:
            env.update(secrets[source["secretRef"]["name"]]["stringData"])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", "<from " + ",".join(var.get("valueFrom", {})) + ">")
    return env


def parse_pvm_command(argv: list[str], where: str) -> Any:
    """Parse a `pvm` command line the way `pvm` would, or skip it if it lands with a later issue."""
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if argv[0] in LATER_COMMANDS and argv[0] not in subcommands.choices:
        return None
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `pvm {' '.join(argv)}` is not a command pvm accepts")


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def compose_command(service: dict[str, Any]) -> list[str]:
    """The pvm arguments a compose service runs (after the image's `pvm` entrypoint, or inside `sh -c`)."""
    if "entrypoint" in service:
        entry = service["entrypoint"]
        assert entry[:2] == ["/bin/sh", "-c"], entry
        argv = shlex.split(entry[2].replace("$$HOSTNAME", "host"))
        assert argv[:2] == ["exec", "pvm"], entry
        return argv[2:]
    return list(service["command"])


# -- Prometheus -----------------------------------------------------------------


def test_promtool_accepts_the_config_and_its_rule_files(promtool: str) -> None:
    out = run_promtool(promtool, "check", "config", PROMETHEUS_CONFIG)
    assert "1 rule files found" in out


def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    run_promtool(promtool, "check", "rules", "--lint=all", "--lint-fatal", ALERTS)


def test_prometheus_scrapes_the_exporter_every_15s() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    assert config["global"]["scrape_interval"] == "15s"
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"pvm-exporter", "prometheus"}
    assert jobs["pvm-exporter"].get("metrics_path", "/metrics") == "/metrics"


def test_every_required_alert_exists_with_a_severity_and_a_summary() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert {
        "PVMStreamLagHigh",
        "PVMStreamLagGrowing",
        "PVMPendingTooOld",
        "PVMFailedJobsRising",
        "PVMDeadLettersRising",
        "PVMQueueWithoutWorkers",
        "PVMJobsStranded",
        "PVMIndexStale",
        "PVMFactsStale",
        "PVMSummariesStale",
        "PVMExporterDown",
        "PVMScheduleLate",
        "PVMSchedulerDown",
    } <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_every_runbook_link_points_at_a_heading_of_the_docs() -> None:
    for rule in alert_rules():
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path.startswith("docs/") and (ROOT / path).is_file(), f"{rule['alert']}: runbook {path!r}"
        anchors = {
            re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
        }
        assert anchor in anchors, f"{rule['alert']}: runbook {anchor!r}"


def test_every_alert_is_in_the_table_of_alerts_yml_and_of_the_monitoring_docs() -> None:
    listed_in_rules = set(re.findall(r"^# \| (PVM\w+)\s", ALERTS.read_text(), re.M))
    monitoring = ROOT / "docs" / "operations" / "monitoring.md"
    listed_in_docs = set(re.findall(r"^\| `(PVM\w+)` \|", monitoring.read_text(), re.M))
    alerts = {rule["alert"] for rule in alert_rules()}
    assert listed_in_rules == alerts
    assert listed_in_docs == alerts


def test_the_lag_alert_is_a_plain_threshold_with_a_short_for() -> None:
    """Tests load PVMStreamLagHigh with their own threshold: it must stay one number to replace."""
    rule = next(r for r in alert_rules() if r["alert"] == "PVMStreamLagHigh")
    assert re.fullmatch(r"max by \(shard, group\) \(pvm_stream_lag\) > \d+", rule["expr"].strip())
    for_s = int(rule["for"].removesuffix("s")) if rule["for"].endswith("s") else 60 * int(rule["for"][:-1])
    assert for_s <= 60


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    labels = {"job": "pvm-exporter", "instance": "exporter:9108", **labels}
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{body}}}", "values": values}


def _case(
    interval: str, series: list[dict[str, str]], *checks: tuple[str, str, list[dict[str, str]]]
) -> dict[str, Any]:
    return {
        "interval": interval,
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in expected]}
            for at, name, expected in checks
        ],
    }


SHARD0 = {"shard": "0", "group": keys.DISPATCH_GROUP}
LOG_QUEUE = {"queue": keys.QUEUES["log"], "pool": "log"}
INDEX_QUEUE = {"queue": keys.QUEUES["index"], "pool": "index"}
FACTS_QUEUE = {"queue": keys.QUEUES["facts"], "pool": "facts"}
SUMMARIZE_QUEUE = {"queue": keys.QUEUES["summarize"], "pool": "summarize"}


def _every(interval_s: int, minutes: int) -> str:
    """Last-run timestamps of a schedule that runs every `interval_s` from 0, one sample a minute."""
    return " ".join(str(m * 60 // interval_s * interval_s) for m in range(minutes + 1))


def _freshness(stage: str, buckets: dict[str, str]) -> list[dict[str, str]]:
    """The pvm_freshness_seconds buckets of a stage: le -> values."""
    return [_series("pvm_freshness_seconds_bucket", values, stage=stage, le=le) for le, values in buckets.items()]


def test_alerts_fire_when_they_should_and_stay_quiet_otherwise(promtool: str, tmp_path: Path) -> None:
    """`promtool test rules` on synthetic series: each alert fires on its failure and not on a healthy pipeline."""
    # Annotations are prose; the unit tests compare labels only.
    rules = load_yaml(ALERTS)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rule_file = tmp_path / "alerts.yml"
    rule_file.write_text(yaml.safe_dump(rules))

    def warn(**labels: str) -> dict[str, str]:
        return {"severity": "warning", **labels}

    def crit(**labels: str) -> dict[str, str]:
        return {"severity": "critical", **labels}

    up = _series("up", "1x60")
    tests = [
        # Lag: high and growing fires both; high and flat fires only the level alert; small growth neither.
        _case(
            "1m",
            [up, _series("pvm_stream_lag", "0+1000x40", **SHARD0)],
            ("25m", "PVMStreamLagHigh", [warn(**SHARD0)]),
            ("25m", "PVMStreamLagGrowing", [crit(**SHARD0)]),
            ("5m", "PVMStreamLagGrowing", []),
        ),
        _case(
            "1m",
            [up, _series("pvm_stream_lag", "20000x40", **SHARD0)],
            ("25m", "PVMStreamLagHigh", [warn(**SHARD0)]),
            ("25m", "PVMStreamLagGrowing", []),
        ),
        _case(
            "1m",
            [up, _series("pvm_stream_lag", "0+10x40", **SHARD0)],
            ("25m", "PVMStreamLagHigh", []),
            ("25m", "PVMStreamLagGrowing", []),
        ),
        # An entry left pending: its age grows by 60 s a minute.
        _case(
            "1m",
            [up, _series("pvm_stream_oldest_pending_age_seconds", "0+60x20", **SHARD0)],
            ("4m", "PVMPendingTooOld", []),
            ("10m", "PVMPendingTooOld", [crit(**SHARD0)]),
        ),
        _case(
            "1m",
            [up, _series("pvm_stream_oldest_pending_age_seconds", "0x20", **SHARD0)],
            ("15m", "PVMPendingTooOld", []),
        ),
        # Failed jobs and dead letters: a rise fires, a steady count (old failures) does not.
        _case(
            "1m",
            [
                up,
                _series("pvm_queue_jobs", "0x5 1x20", status="failed", **LOG_QUEUE),
                _series("pvm_dead_letters", "0x5 3x20", shard="1"),
                _series("pvm_dead_letters_added_total", "0x5 3x20", shard="1"),
            ],
            ("8m", "PVMFailedJobsRising", [warn(**LOG_QUEUE)]),
            ("8m", "PVMDeadLettersRising", [warn(shard="1")]),
            ("20m", "PVMFailedJobsRising", []),
            ("20m", "PVMDeadLettersRising", []),
        ),
        # A dead-letter stream at its MAXLEN cap: the length stays put, new dead letters still fire.
        _case(
            "1m",
            [
                up,
                _series("pvm_dead_letters", "1000000x30", shard="2"),
                _series("pvm_dead_letters_added_total", "1000000+5x30", shard="2"),
            ],
            ("20m", "PVMDeadLettersRising", [warn(shard="2")]),
        ),
        # A deleted dead-letter stream reads 0 (a counter reset), which is not a new dead letter.
        _case(
            "1m",
            [
                up,
                _series("pvm_dead_letters", "50x5 0x20", shard="3"),
                _series("pvm_dead_letters_added_total", "50x5 0x20", shard="3"),
            ],
            ("8m", "PVMDeadLettersRising", []),
            ("20m", "PVMDeadLettersRising", []),
        ),
        # Work and no workers for 5 minutes fires; the same backlog with a worker does not.
        _case(
            "1m",
            [
                up,
                _series("pvm_queue_jobs", "5x20", status="queued", **LOG_QUEUE),
                _series("pvm_queue_workers", "0x20", **LOG_QUEUE),
                _series("pvm_queue_jobs", "5x20", status="queued", queue=keys.QUEUES["index"], pool="index"),
                _series("pvm_queue_workers", "1x20", queue=keys.QUEUES["index"], pool="index"),
            ],
            ("3m", "PVMQueueWithoutWorkers", []),
            ("10m", "PVMQueueWithoutWorkers", [crit(**LOG_QUEUE)]),
        ),
        # A log job stays dequeued from 3m (its worker died and no PVM worker reaps it): pending, then firing.
        # Index workers dequeue all the time: a moment's 1 or 2 at one scrape in two, never 5 minutes on end.
        # Another index job sat dequeued for 3 minutes until a worker came back and requeued it: quiet too.
        _case(
            "1m",
            [
                up,
                _series("pvm_queue_jobs", "0x2 1x30", status="dequeued", **LOG_QUEUE),
                _series("pvm_queue_jobs", " ".join(["1 0 2 0"] * 8), status="dequeued", **INDEX_QUEUE),
                _series("pvm_queue_jobs", "0x2 5x30", status="queued", **INDEX_QUEUE),
            ],
            ("6m", "PVMJobsStranded", []),
            ("10m", "PVMJobsStranded", [warn(**LOG_QUEUE)]),
            ("30m", "PVMJobsStranded", [warn(**LOG_QUEUE)]),
        ),
        _case(
            "1m",
            [up, _series("pvm_queue_jobs", "0x5 1x3 0x20", status="dequeued", **INDEX_QUEUE)],
            ("8m", "PVMJobsStranded", []),
            ("12m", "PVMJobsStranded", []),
            ("25m", "PVMJobsStranded", []),
        ),
        # Minutes take 60-300 s to become durable, for longer than 10 minutes.
        _case(
            "1m",
            [
                up,
                *(
                    _series("pvm_freshness_seconds_bucket", values, stage="durable", le=le)
                    for le, values in [("1.0", "0x40"), ("60.0", "0x40"), ("300.0", "0+10x40"), ("+Inf", "0+10x40")]
                ),
                *(
                    _series("pvm_freshness_seconds_bucket", values, stage="indexed", le=le)
                    for le, values in [
                        ("1.0", "0+10x40"),
                        ("60.0", "0+10x40"),
                        ("300.0", "0+10x40"),
                        ("+Inf", "0+10x40"),
                    ]
                ),
            ],
            ("25m", "PVMFreshnessSlow", [warn(stage="durable")]),
            ("25m", "PVMIndexStale", []),
        ),
        # Index: minutes durable within a second but indexed 300-900 s after emit, for longer than 10 minutes.
        _case(
            "1m",
            [
                up,
                *_freshness("durable", {"1.0": "0+10x40", "300.0": "0+10x40", "900.0": "0+10x40", "+Inf": "0+10x40"}),
                *_freshness("indexed", {"1.0": "0x40", "300.0": "0x40", "900.0": "0+10x40", "+Inf": "0+10x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0x40", **INDEX_QUEUE),
            ],
            ("5m", "PVMIndexStale", []),
            ("25m", "PVMIndexStale", [warn(stage="indexed")]),
            ("25m", "PVMFreshnessSlow", []),
        ),
        # Index: the pool indexes nothing (no freshness recorded) and its next job waits longer and longer.
        _case(
            "1m",
            [
                up,
                *_freshness("indexed", {"1.0": "100x40", "300.0": "100x40", "+Inf": "100x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0+60x40", **INDEX_QUEUE),
                _series("pvm_queue_oldest_waiting_seconds", "0x40", **LOG_QUEUE),
            ],
            ("10m", "PVMIndexStale", []),
            ("20m", "PVMIndexStale", [warn(**INDEX_QUEUE)]),
        ),
        # Index: an idle pipeline (nothing indexed, nothing waiting) and a slow log queue do not fire it.
        _case(
            "1m",
            [
                up,
                *_freshness("indexed", {"1.0": "100x40", "300.0": "100x40", "+Inf": "100x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0x40", **INDEX_QUEUE),
                _series("pvm_queue_oldest_waiting_seconds", "0+60x40", **LOG_QUEUE),
            ],
            ("30m", "PVMIndexStale", []),
        ),
        # Facts: minutes indexed in time but their facts applied 300-900 s after emit; then a facts queue that waits.
        _case(
            "1m",
            [
                up,
                *_freshness("indexed", {"1.0": "0+10x40", "300.0": "0+10x40", "+Inf": "0+10x40"}),
                *_freshness("facts", {"1.0": "0x40", "300.0": "0x40", "900.0": "0+10x40", "+Inf": "0+10x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0x40", **FACTS_QUEUE),
            ],
            ("5m", "PVMFactsStale", []),
            ("25m", "PVMFactsStale", [warn(stage="facts")]),
            ("25m", "PVMIndexStale", []),
        ),
        _case(
            "1m",
            [
                up,
                *_freshness("facts", {"1.0": "100x40", "300.0": "100x40", "+Inf": "100x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0+60x40", **FACTS_QUEUE),
                _series("pvm_queue_oldest_waiting_seconds", "0+60x40", **INDEX_QUEUE),
            ],
            ("10m", "PVMFactsStale", []),
            ("20m", "PVMFactsStale", [warn(**FACTS_QUEUE)]),
            ("20m", "PVMSummariesStale", []),
        ),
        # Summaries: facts in time but minutes reach the summarize pool 600-900 s after emit; then its queue waits.
        _case(
            "1m",
            [
                up,
                *_freshness("facts", {"1.0": "0+10x40", "300.0": "0+10x40", "+Inf": "0+10x40"}),
                *_freshness("summarize", {"1.0": "0x40", "600.0": "0x40", "900.0": "0+10x40", "+Inf": "0+10x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0x40", **SUMMARIZE_QUEUE),
            ],
            ("5m", "PVMSummariesStale", []),
            ("25m", "PVMSummariesStale", [warn(stage="summarize")]),
            ("25m", "PVMFactsStale", []),
        ),
        # A summarize queue that waits 10 minutes and longer; summaries 300-600 s late alone stay quiet.
        _case(
            "1m",
            [
                up,
                *_freshness("summarize", {"1.0": "0x40", "300.0": "0x40", "600.0": "0+10x40", "+Inf": "0+10x40"}),
                _series("pvm_queue_oldest_waiting_seconds", "0+60x40", **SUMMARIZE_QUEUE),
            ],
            ("15m", "PVMSummariesStale", []),
            ("25m", "PVMSummariesStale", [warn(**SUMMARIZE_QUEUE)]),
            ("25m", "PVMFactsStale", []),
        ),
        # The exporter: a failing target, a missing target, Redis errors.
        _case(
            "1m",
            [_series("up", "1 1 0x10")],
            ("8m", "PVMExporterDown", [crit(job="pvm-exporter", instance="exporter:9108")]),
        ),
        _case(
            "1m", [_series("pvm_stream_lag", "0x10", **SHARD0)], ("5m", "PVMExporterDown", [crit(job="pvm-exporter")])
        ),
        _case("1m", [up], ("5m", "PVMExporterDown", [])),
        _case(
            "1m",
            [up, _series("pvm_exporter_scrape_errors_total", "0+2x20")],
            ("10m", "PVMExporterCannotReadRedis", [crit(job="pvm-exporter", instance="exporter:9108")]),
        ),
        _case(
            "1m",
            [up, _series("pvm_exporter_scrape_errors_total", "3x20")],
            ("10m", "PVMExporterCannotReadRedis", []),
        ),
        # Schedules (promtool's clock starts at Unix time 0; one sample a minute). `optimize` (hourly) ran at
        # 0 and not again until 210m: 3 * 3600 s is up at 180m, it fires 10m later and resolves with the run.
        # `compact` runs every 10 minutes as it should. `fresh` (every 60 s) never ran: not late, however long.
        _case(
            "1m",
            [
                up,
                _series("pvm_scheduler_leader", "1x240", scheduler="sched-a"),
                _series("pvm_schedule_interval_seconds", "3600x240", schedule="optimize"),
                _series("pvm_schedule_last_run_timestamp_seconds", "0x209 12600x30", schedule="optimize"),
                _series("pvm_schedule_interval_seconds", "600x240", schedule="compact"),
                _series("pvm_schedule_last_run_timestamp_seconds", _every(600, 240), schedule="compact"),
                _series("pvm_schedule_interval_seconds", "60x240", schedule="fresh"),
            ],
            ("185m", "PVMScheduleLate", []),
            ("200m", "PVMScheduleLate", [warn(schedule="optimize")]),
            ("220m", "PVMScheduleLate", []),
            ("200m", "PVMSchedulerDown", []),
        ),
        # The evaluate schedule (hourly) is enqueued on time, but the runs it starts stop completing: project
        # `b` last completed at 0 while `a` keeps completing. Late once b's completion is 3 intervals old.
        _case(
            "1m",
            [
                up,
                _series("pvm_scheduler_leader", "1x240", scheduler="sched-a"),
                _series("pvm_schedule_interval_seconds", "3600x240", schedule="evaluate"),
                _series("pvm_schedule_last_run_timestamp_seconds", _every(3600, 240), schedule="evaluate"),
                _series("pvm_evaluation_last_completed_timestamp_seconds", _every(3600, 240), project="a"),
                _series("pvm_evaluation_last_completed_timestamp_seconds", "0x240", project="b"),
            ],
            ("185m", "PVMScheduleLate", []),
            ("200m", "PVMScheduleLate", [warn(schedule="evaluate")]),
        ),
        # The scheduler stops at 10m: its lease (and the leader series) is gone, the schedules are still recorded.
        _case(
            "1m",
            [
                up,
                _series("pvm_scheduler_leader", "1x10", scheduler="sched-a"),
                _series("pvm_schedule_interval_seconds", "3600x40", schedule="optimize"),
            ],
            ("12m", "PVMSchedulerDown", []),
            ("30m", "PVMSchedulerDown", [warn()]),
        ),
        # A failover (another scheduler takes the lease) and a stack with no schedules at all stay quiet.
        _case(
            "1m",
            [
                up,
                _series("pvm_scheduler_leader", "1x10", scheduler="sched-a"),
                _series("pvm_scheduler_leader", "_x10 1x30", scheduler="sched-b"),
                _series("pvm_schedule_interval_seconds", "3600x40", schedule="optimize"),
            ],
            ("30m", "PVMSchedulerDown", []),
        ),
        _case("1m", [up], ("30m", "PVMSchedulerDown", []), ("30m", "PVMScheduleLate", [])),
    ]
    spec = {"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": tests}
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_promtool(promtool, "test", "rules", test_file)


def test_the_index_alert_says_which_sign_fired(promtool: str, tmp_path: Path) -> None:
    """PVMIndexStale has two signs; its summary (a template with a branch) names the one that fired."""
    rule = next(r for r in alert_rules() if r["alert"] == "PVMIndexStale")
    rule_file = tmp_path / "alerts.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "pvm", "rules": [rule]}]}))

    def fired(labels: dict[str, str], summary: str) -> dict[str, Any]:
        return {
            "exp_labels": {"severity": "warning", **labels},
            "exp_annotations": {**rule["annotations"], "summary": summary},
        }

    slow = _freshness("indexed", {"300.0": "0x40", "900.0": "0+10x40", "+Inf": "0+10x40"})
    stuck = [_series("pvm_queue_oldest_waiting_seconds", "0+60x40", **INDEX_QUEUE)]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": at, "alertname": "PVMIndexStale", "exp_alerts": [expected]}],
        }
        for series, at, expected in [
            # p99 between the 300 s and 900 s buckets: 300 + 0.99 * 600 = 894 s
            (slow, "25m", fired({"stage": "indexed"}, "The index is 14m 54s behind (p99 emit -> indexed)")),
            (
                stuck,
                "20m",
                fired(INDEX_QUEUE, f"The index is 20m 0s behind (oldest job waiting in {keys.QUEUES['index']})"),
            ),
        ]
    ]
    spec = {"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": tests}
    test_file = tmp_path / "index_alert_test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_promtool(promtool, "test", "rules", test_file)


# -- metric names -----------------------------------------------------------------


def _exporter_families(redis_client: redis.Redis, settings: Settings) -> list[Metric]:
    Dispatcher(redis_client, settings, consumer="deploy-test").ensure_groups()
    recorder = MetricsRecorder(redis_client)
    recorder.batch("log", 10, 0.01, failures=1)
    recorder.freshness("durable", [0.1])
    recorder.provider_call("openai", "embedding", "ok", 0.1, tokens=5)
    recorder.extraction("llm", {"chunks:answered": 1, "items:kept": 3})
    # What a leading `pvm scheduler` keeps: a schedule that ran, and its lease.
    redis_client.hset(keys.schedules(), mapping={"optimize:every": "3600.0", "optimize:last": "1700000000.0"})
    redis_client.set(keys.scheduler_leader(), "deploy-test-scheduler", px=60_000)
    # What an evaluation run leaves: a project's run, its completion.
    redis_client.hset(keys.evaluation_run("p1"), mapping={"run_id": "r", "minute_slices": 2, "slices_done": 1})
    redis_client.hset(keys.evaluated_projects(), "p1", "1700000000.0")
    return list(PvmCollector(redis_client, settings).collect())


def test_the_metric_list_matches_what_the_exporter_serves(redis_client: redis.Redis, settings: Settings) -> None:
    served: dict[str, tuple[str, frozenset[str]]] = {}
    for family in _exporter_families(redis_client, settings):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        served[name] = (family.type, frozenset(labels))
    assert served == METRICS


def test_metric_names_follow_prometheus_conventions() -> None:
    for name, (kind, labels) in METRICS.items():
        assert re.fullmatch(r"pvm_[a-z][a-z0-9_]*[a-z0-9]", name), name
        assert name.endswith("_total") == (kind == "counter"), f"{name}: only counters end in _total"
        # Base units: seconds, not ms/minutes/hours. ("minutes" in pvm_stage_minutes_total counts
        # coordination minutes, PVM's records, not time.)
        words = name.removesuffix("_total").split("_")
        assert not set(words) & {"milliseconds", "ms", "microseconds", "hours", "days", "kilobytes", "megabytes"}
        if set(words) & {"duration", "latency", "age", "freshness", "waiting", "interval", "timestamp"}:
            assert name.endswith("_seconds"), f"{name}: a duration or a point in time is measured in seconds"
        assert labels <= METRIC_LABELS


def test_alerts_and_dashboard_query_only_served_metrics_and_labels() -> None:
    known = {**METRICS, **PROMETHEUS_SERIES}
    for where, expr in queried_expressions():
        samples = set(re.findall(r"\b(pvm_[a-z0-9_]+|up)\b", expr))
        assert samples, f"{where}: queries no PVM metric: {expr}"
        metrics = {series_name(s) for s in samples}
        unknown = metrics - set(known)
        assert not unknown, f"{where}: {sorted(unknown)} is not a metric the exporter serves"
        for sample in samples:
            if sample.endswith(("_bucket", "_sum", "_count")):
                assert series_name(sample) != sample, f"{where}: {sample} of a metric that is not a histogram"
        allowed = set(TARGET_LABELS).union(*(known[m][1] for m in metrics))
        if any(s.endswith("_bucket") for s in samples):
            allowed.add("le")
        used = set(re.findall(r"\b([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"", expr))
        for grouping in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", expr):
            used |= {label.strip() for label in grouping.split(",") if label.strip()}
        assert used <= allowed, f"{where}: labels {sorted(used - allowed)} are not on {sorted(metrics)}"
        for status in re.findall(r'status\s*=\s*"([^"]+)"', expr):
            assert status in QUEUE_STATUSES, f"{where}: pvm_queue_jobs has no status {status!r}"


def test_rate_functions_match_metric_types() -> None:
    """rate/increase need counters; delta/deriv need gauges (a gauge that drops would read as a counter reset)."""
    for where, expr in queried_expressions():
        for func, sample in re.findall(r"\b(rate|irate|increase|delta|idelta|deriv)\(\s*([a-z_:][a-z0-9_:]*)", expr):
            metric = series_name(sample)
            kind = METRICS[metric][0] if metric in METRICS else PROMETHEUS_SERIES[metric][0]
            counterish = kind == "counter" or (kind == "histogram" and sample != metric)
            if func in {"rate", "irate", "increase"}:
                assert counterish, f"{where}: {func}() of {sample}, which is not a counter"
            else:
                assert kind == "gauge", f"{where}: {func}() of {sample}, which is not a gauge"


# -- Grafana --------------------------------------------------------------------


def test_the_dashboard_is_a_grafana_dashboard_with_the_panels_operators_need() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and 36 <= dash["schemaVersion"] <= 41
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        grid = p["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(refs) == len(set(refs)), p["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    exprs = "\n".join(t["expr"] for _, t in dashboard_targets())
    # lag per shard, pending age, dead letters added, throughput, freshness p50/p99, failures, queue depth, workers,
    # time since each schedule's last run
    for needle in [
        "by (shard, group) (pvm_stream_lag)",
        "pvm_stream_oldest_pending_age_seconds",
        "rate(pvm_dead_letters_added_total",
        "rate(pvm_stage_minutes_total",
        "histogram_quantile(0.5, sum by (le, stage) (rate(pvm_freshness_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, stage) (rate(pvm_freshness_seconds_bucket",
        "pvm_stage_failures_total",
        'pvm_queue_jobs{status="queued"}',
        "pvm_queue_workers",
        "time() - max by (schedule) (pvm_schedule_last_run_timestamp_seconds)",
    ]:
        assert needle in exprs, needle


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    """Each dashboard query becomes a recording rule, so promtool's PromQL parser checks it."""
    rules = [
        {"record": f"pvm_dashboard_check:panel{p['id']}_{t['refId']}", "expr": dashboard_expr_as_promql(t["expr"])}
        for p, t in dashboard_targets()
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", path)


# -- Kubernetes and KEDA -----------------------------------------------------------


def test_every_kubernetes_manifest_validates_against_its_schema() -> None:
    docs = k8s_documents()
    assert docs
    for filename, doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{filename}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_every_scaled_object_uses_only_fields_keda_defines() -> None:
    scaled = [(f, d) for f, d in k8s_documents() if d["apiVersion"].startswith("keda.sh/")]
    assert {d["kind"] for _, d in scaled} == {"ScaledObject"}
    for filename, doc in scaled:
        try:
            jsonschema.validate(doc, KEDA_SCALED_OBJECT_SCHEMA)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{filename}: ScaledObject/{doc['metadata']['name']}: {exc.json_path}: {exc.message}")


def test_every_keda_trigger_uses_only_the_metadata_its_scaler_defines() -> None:
    deployments = k8s_objects("Deployment")
    for name, scaled in k8s_objects("ScaledObject").items():
        target = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
        env = container_env(target)
        for trigger in scaled["spec"]["triggers"]:
            kind, meta = trigger["type"], trigger["metadata"]
            assert kind in KEDA_TRIGGER_METADATA, f"{name}: trigger type {kind!r}"
            unknown = set(meta) - KEDA_TRIGGER_METADATA[kind]
            assert not unknown, f"{name}: {kind} scaler defines no metadata {sorted(unknown)}"
            assert {"address", "host", "addressFromEnv", "hostFromEnv"} & set(meta), f"{name}: no Redis address"
            for key, value in meta.items():
                if key.endswith("FromEnv"):
                    assert value in env, f"{name}: {key}={value} is not in {target['metadata']['name']}'s environment"
            if kind == "redis-streams":
                assert {"stream", "consumerGroup", "lagCount", "activationLagCount"} <= set(meta), name
                assert int(meta["lagCount"]) > 0
            else:
                assert {"listName", "listLength"} <= set(meta), name
                assert int(meta["listLength"]) > 0


def test_the_dispatcher_scales_on_the_lag_of_every_shard_stream() -> None:
    shards = int(k8s_objects("ConfigMap")["pvm-config"]["data"]["PVM_SHARDS"])
    scaled = k8s_objects("ScaledObject")["pvm-dispatcher"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "pvm-dispatcher"
    assert scaled["spec"]["minReplicaCount"] >= 1  # dispatchers also reclaim and trim
    triggers = scaled["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"redis-streams"}
    assert sorted(t["metadata"]["stream"] for t in triggers) == sorted(keys.stream(s) for s in range(shards))
    assert {t["metadata"]["consumerGroup"] for t in triggers} == {keys.DISPATCH_GROUP}


def test_every_pool_has_a_deployment_scaled_on_its_rq_queue() -> None:
    deployments = k8s_objects("Deployment")
    scaled = k8s_objects("ScaledObject")
    pool_deployments = {
        name: d
        for name, d in deployments.items()
        if d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "worker"
    }
    for pool, queue in keys.QUEUES.items():
        name = f"pvm-{pool}"
        args = deployments[name]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["worker", pool], name
        (trigger,) = scaled[name]["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == f"{Queue.redis_queue_namespace_prefix}{queue}"
        assert scaled[name]["spec"]["scaleTargetRef"]["name"] == name
    served = {d["spec"]["template"]["spec"]["containers"][0]["args"][1] for d in pool_deployments.values()}
    assert served == set(keys.QUEUES), "a worker Deployment for a pool contracts.keys does not know"


def test_the_log_pool_shares_one_persistent_volume() -> None:
    log = k8s_objects("Deployment")["pvm-log"]
    pod = log["spec"]["template"]["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
    }
    assert list(claims.values()) == ["pvm-log"] and "pvm-log" in k8s_objects("PersistentVolumeClaim")
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    home = k8s_objects("ConfigMap")["pvm-config"]["data"]["PVM_HOME"]
    assert mounts[home] in claims, "the log ($PVM_HOME/var/log) must be on the claim"
    assert log["spec"]["strategy"]["type"] == "Recreate"
    term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == log["spec"]["selector"]["matchLabels"]
    # No other workload writes the log volume or mounts it on another node: the evaluate pool reads the log,
    # read-only, on the log's node.
    for name, d in k8s_objects("Deployment").items():
        spec = d["spec"]["template"]["spec"]
        claimed = [v for v in spec.get("volumes", []) if "persistentVolumeClaim" in v]
        if name == "pvm-log" or not claimed:
            continue
        assert name == "pvm-evaluate", name
        assert all(v["persistentVolumeClaim"].get("readOnly") for v in claimed), name
        assert all(
            m.get("readOnly")
            for m in spec["containers"][0]["volumeMounts"]
            if m["name"] in {v["name"] for v in claimed}
        ), name
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"]["matchLabels"] == log["spec"]["selector"]["matchLabels"], name


def test_every_container_runs_a_pvm_command_with_the_shared_settings() -> None:
    config = k8s_objects("ConfigMap")["pvm-config"]["data"]
    secret = k8s_objects("Secret")["pvm-secrets"]["stringData"]
    assert set(secret) == {"PVM_REDIS_URL", "OPENAI_API_KEY", "PVM_QDRANT_API_KEY", "KEDA_REDIS_PASSWORD"}
    assert not [k for k in config if re.search(r"KEY|PASSWORD|TOKEN|SECRET", k)], "secrets belong in pvm-secrets"
    Settings.from_env({**config, **secret})  # raises ConfigError on a value pvm cannot use
    for name, deployment in k8s_objects("Deployment").items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        refs = [next(iter(s.values()))["name"] for s in container["envFrom"]]
        assert refs == ["pvm-config", "pvm-secrets"], name
        argv = [a.replace("$(POD_NAME)", "pod-0") for a in container["args"]]
        parse_pvm_command(argv, f"deploy/k8s Deployment {name}")


def test_the_exporter_and_api_services_reach_their_pods() -> None:
    deployments, services = k8s_objects("Deployment"), k8s_objects("Service")
    for name, port in [("pvm-exporter", 9108), ("pvm-api", 8080)]:
        service, deployment = services[name], deployments[name]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][container["args"].index("--port") + 1] == str(port)
        assert container["args"][container["args"].index("--addr") + 1] == "0.0.0.0"
        assert [p["containerPort"] for p in container["ports"]] == [port]
        assert [p["port"] for p in service["spec"]["ports"]] == [port]


def test_kustomization_lists_the_manifests() -> None:
    text = (K8S_DIR / "kustomization.yaml").read_text()
    listed = yaml.safe_load(text)["resources"]
    files = sorted(p.name for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
    assert set(listed) <= set(files)
    for name in set(files) - set(listed):  # left out on purpose, with the reason beside it
        assert re.search(rf"^\s*#\s*-\s*{re.escape(name)}\s+#", text, re.M), f"{name} is not in kustomization.yaml"


# -- docker compose -----------------------------------------------------------------


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    # The compose-spec JSON schema as vendored (and kept current) by check-jsonschema.
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    errors = sorted(validator_class(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)


def test_compose_runs_every_pool_as_its_own_scalable_service() -> None:
    services = compose()["services"]
    assert set(services) == COMPOSE_SERVICES | set(keys.QUEUES)
    scalable = {"dispatcher", *keys.QUEUES}
    for name, service in services.items():
        assert "container_name" not in service, f"{name}: container_name prevents --scale"
        if name in scalable:
            for port in service.get("ports", []):
                # short syntax: [HOST:]CONTAINER or IP:HOST:CONTAINER; the host part is what gets published
                parts = str(port).split(":")
                published = port.get("published") if isinstance(port, dict) else (parts[-2] if len(parts) > 1 else "")
                assert not published, f"{name}: a fixed host port prevents --scale"
    for pool in keys.QUEUES:
        assert compose_command(services[pool]) == ["worker", pool]


def test_compose_uses_one_image_and_commands_pvm_accepts() -> None:
    services = compose()["services"]
    pvm_services = {n: s for n, s in services.items() if s.get("image", "").startswith("pvm:")}
    assert set(pvm_services) == {"dispatcher", "scheduler", "exporter", "api", *keys.QUEUES}
    assert len({s["image"] for s in pvm_services.values()}) == 1
    for name, service in pvm_services.items():
        parse_pvm_command(compose_command(service), f"docker-compose.yml service {name}")
        env = {k: str(v) for k, v in service["environment"].items() if v is not None}
        Settings.from_env(env)
        assert env["PVM_REDIS_URL"] == "redis://redis:6379/0"
    assert pvm_services["index"]["environment"]["PVM_QDRANT_URL"] == "http://qdrant:6333"
    k8s_shards = k8s_objects("ConfigMap")["pvm-config"]["data"]["PVM_SHARDS"]
    assert pvm_services["dispatcher"]["environment"]["PVM_SHARDS"] == k8s_shards


def test_compose_redis_keeps_an_aof_on_a_volume() -> None:
    redis_service = compose()["services"]["redis"]
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.split(":")[1] == "/data" for v in redis_service["volumes"])
    assert compose()["services"]["log"]["volumes"][0].split(":")[1] == "/data"  # PVM_HOME: the log


def test_compose_prometheus_scrapes_the_compose_exporter_with_the_deploy_config() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    exporter = compose_command(services["exporter"])
    assert exporter[0] == "exporter" and exporter[exporter.index("--addr") + 1] == "0.0.0.0"
    port = exporter[exporter.index("--port") + 1]
    job = next(j for j in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"] if j["job_name"] == "pvm-exporter")
    assert job["static_configs"][0]["targets"] == [f"exporter:{port}"]


# -- MCP beside the API (docs/mcp.md) ----------------------------------------------


def test_the_api_serves_the_mcp_tools_in_compose_and_kubernetes_from_an_image_with_the_mcp_extra() -> None:
    """The deployed API is `pvm serve --mcp`: the tools at /mcp of the API's own port, nothing else to expose."""
    [extras] = re.findall(r"^RUN pip install '\.\[([a-z,]+)\]'", DOCKERFILE.read_text(), re.M)
    assert {"server", "mcp"} <= set(extras.split(",")), "Dockerfile: pip install '.[server,mcp]'"
    api = compose_command(compose()["services"]["api"])
    container = k8s_objects("Deployment")["pvm-api"]["spec"]["template"]["spec"]["containers"][0]
    for where, argv in (("docker-compose.yml api", api), ("deploy/k8s pvm-api", list(container["args"]))):
        parsed = parse_pvm_command(argv, where)
        assert argv[0] == "serve" and parsed.mcp, f"{where}: run `pvm serve ... --mcp`"


# -- values the deploy files repeat from pvm/defaults.py (area: settings) ----------


def test_deploy_files_repeat_the_python_defaults() -> None:
    """YAML cannot import pvm.defaults: each port and setting the deploy files repeat must equal it."""
    api, exporter = defaults.API_PORT, defaults.EXPORTER_PORT
    services = compose()["services"]
    for name, port in (("api", api), ("exporter", exporter)):
        argv = compose_command(services[name])
        assert argv[argv.index("--port") + 1] == str(port), f"docker-compose.yml {name} --port"
        assert services[name]["ports"] == [f"127.0.0.1:{port}:{port}"], f"docker-compose.yml {name} ports"
    assert f"//127.0.0.1:{api}/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    job = next(j for j in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"] if j["job_name"] == "pvm-exporter")
    assert job["static_configs"][0]["targets"] == [f"exporter:{exporter}"], "deploy/prometheus/prometheus.yml"

    deployments, k8s_services = k8s_objects("Deployment"), k8s_objects("Service")
    for name, port in (("pvm-api", api), ("pvm-exporter", exporter)):
        container = deployments[name]["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][container["args"].index("--port") + 1] == str(port), f"deploy/k8s {name} --port"
        assert [p["containerPort"] for p in container["ports"]] == [port], f"deploy/k8s {name} containerPort"
        assert [p["port"] for p in k8s_services[name]["spec"]["ports"]] == [port], f"deploy/k8s Service {name}"
    assert k8s_services["pvm-exporter"]["metadata"]["annotations"]["prometheus.io/port"] == str(exporter)

    # An agent that sets nothing must agree with the deployed dispatchers and log pool.
    for where, env in (
        ("deploy/k8s/configmap.yaml", k8s_objects("ConfigMap")["pvm-config"]["data"]),
        ("docker-compose.yml", services["dispatcher"]["environment"]),
    ):
        assert env["PVM_SHARDS"] == str(defaults.SHARDS), f"{where}: PVM_SHARDS"
        assert env["PVM_DOWNSTREAM"] == ",".join(defaults.DOWNSTREAM), f"{where}: PVM_DOWNSTREAM"
