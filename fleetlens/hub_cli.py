"""`fleetlens hub`, `query`, `steps import` and `detect`: the hub and what reads or fills its store
(the hub extra)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics.detectors import build as build_detectors
from analytics.detectors.runner import DetectionRunner, detect, store_anomalies
from analytics.detectors.shared_faults import SharedFaults
from analytics.errors import RetentionRefused, SettingError
from analytics.evidence import as_dict
from analytics.store import Store
from analytics.store.hubclient import HubClient
from analytics.store.readonly import ReadLimits
from analytics.store.records import Anomaly
from analytics.store.redact import redacted
from analytics.store.retention import check_keep_days, import_refusal, keep_until
from collectors.httpserver import serve_app
from collectors.steprecord import StepRecord, read_step_records
from fleetlens.access import hub_config, load, open_store, reader, retention
from fleetlens.alerting import build_alert_service
from fleetlens.config import Config
from fleetlens.errors import ConfigError
from fleetlens.serving import scheme, serve_until_signal, web_config
from hub.app import Hub
from hub.auth import Tokens, is_loopback_host
from hub.bodies import ReceiverLimits
from hub.detect import DetectionLoop
from hub.errors import TokenFileError
from hub.otlp import OtlpStepReceiver
from hub.placements import KubernetesPlacements, PlacementPoller, SlurmPlacements
from hub.queryslots import QuerySlots
from hub.remote_write import NodeIdentity, RemoteWriteLimits, RemoteWriteReceiver
from hub.scraper import Scraper
from hub.spool import Spool
from hub.targets import Shard, TargetsFile
from hub.targetsession import ScrapeLimits
from hub.topology import InventoryFile
from hub.writer import Writer

log = logging.getLogger("fleetlens")

IMPORT_CHUNK = 100_000  # step rows per insert when importing a file into the store
ANOMALY_COLUMNS = ("start", "end", "kind", "node", "component", "job", "severity", "score", "detector")


def build_hub(settings: Config, tokens: Tokens) -> Hub:
    """Wire store, spool, writer, receivers, (with a targets file) the scraper of this hub's shard, and
    detection with alerting and draining after each window. The writer, the detection loop and the API
    each have a session of their own on the store, and queries run on read sessions apart from all
    three, so none waits for another's statements."""
    config = settings.hub
    store = open_store(config)
    writer = Writer(store.session(), Spool(config.spool_dir, config.spool_max_bytes))
    limits = ReceiverLimits(config.max_body_bytes, config.max_label_length, config.max_rows_per_request)
    scraper = None
    if config.targets is not None:
        scraper = Scraper(
            TargetsFile(config.targets).current,
            interval_s=config.interval_s,
            timeout_s=config.timeout_s,
            shard=Shard(*config.shard_index_count),
            limits=ScrapeLimits(config.max_body_bytes, config.max_series_per_target, config.max_label_length),
        )
    detection, closing = None, []
    if config.detector_names != []:
        detection_store = store.session()
        alerting = build_alert_service(detection_store, settings.alerts, settings.drain, settings.lifecycle)
        closing.append(alerting.close)
        detection = DetectionLoop(
            DetectionRunner(
                build_detectors(config.detector_names), config.detect_window_s, shared_faults=SharedFaults()
            ),
            detection_store,
            window_s=config.detect_window_s,
            lag_s=config.lag_s,
            alerting=alerting,
        )
    inventory = None if config.topology_file is None else InventoryFile(config.topology_file, store)
    placements: list[PlacementPoller] = []
    if config.slurm_placements:
        placements.append(SlurmPlacements(store))
    if config.k8s_placements:
        placements.append(KubernetesPlacements(store))
    return Hub(
        store,
        writer,
        OtlpStepReceiver(limits),
        scraper,
        detection=detection,
        inventory=inventory,
        placements=placements,
        remote_write=RemoteWriteReceiver(
            RemoteWriteLimits(
                config.max_body_bytes,
                config.remote_write_max_series,
                config.remote_write_max_samples,
                config.max_label_length,
            ),
            NodeIdentity(config.node_labels),
        ),
        closing=closing,
        tokens=tokens,
        max_body_bytes=config.max_body_bytes,
        query_max_rows=config.query_max_rows,
        promql_max_samples=config.promql_max_samples,
        query_max_seconds=config.query_max_seconds,
        query_limits=ReadLimits(
            max_memory_bytes=config.query_max_memory_bytes,
            max_rows_to_read=config.query_max_rows_to_read,
            max_bytes_to_read=config.query_max_bytes_to_read,
            max_result_bytes=config.query_max_result_bytes,
            max_threads=config.query_max_threads,
        ),
        query_slots=QuerySlots(config.query_slots, config.query_slots_per_client, config.query_queue_s),
        retention=retention(config),
    )


def cmd_hub(args: argparse.Namespace) -> int:
    settings = load(args)
    config = settings.hub
    try:
        tokens = Tokens.load(os.environ.get("FLEETLENS_API_TOKEN"), config.token_file)
    except TokenFileError as exc:
        raise ConfigError(f"hub.token_file: {exc}") from None
    host, port = config.host_port
    if not tokens.configured and not config.listen_without_token and not is_loopback_host(host):
        raise ConfigError(
            f"hub.listen {config.listen}: not a loopback address, and no API token is set, so every other "
            "client would get 403; set FLEETLENS_API_TOKEN or hub.token_file, or listen on 127.0.0.1, or "
            "say it is meant with --listen-without-token (hub.listen_without_token)"
        )
    web = web_config(config.web_config_file, "hub.web_config_file")
    if web is not None and web.current().users and tokens.configured:
        raise ConfigError(
            f"hub.web_config_file {config.web_config_file}: basic_auth_users and API tokens both need the "
            "Authorization header; use the tokens (hub.token_file) and leave basic_auth_users out"
        )
    hub = build_hub(settings, tokens)
    server = serve_app(hub.app, host, port, web=web)
    hub.start()
    print(
        f"fleetlens hub: API at {scheme(web)}://{host}:{server.server_port} (store {redacted(config.store)})",
        flush=True,
    )
    if not tokens.configured:
        log.warning(
            "no API token (FLEETLENS_API_TOKEN or hub.token_file): the API answers loopback clients only"
        )
    serve_until_signal(server, hub.close)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    source = reader(args)
    try:
        result = source.query(args.sql, max_rows=args.max_rows)
    finally:
        if not args.hub:
            source.close()
    if args.json:
        rows = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
        print(json.dumps(rows, default=str))
    else:
        print("\t".join(result.columns))
        for row in result.rows:
            print("\t".join(str(value) for value in row))
    if result.truncated:
        print(f"fleetlens: result cut at {args.max_rows} rows", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class StepsImport:
    """What an import did: `stored` of its `records`, and why the rest were refused ("" if none were)."""

    records: int
    stored: int
    refused: str = ""


def cmd_steps_import(args: argparse.Namespace) -> int:
    """Import a finished job's step JSON lines, whole or not at all: every record is checked first (the
    first bad one named by its line), and a file holding records older than the steps retention is
    refused, naming the cutoff, unless --keep-days keeps them. Exit 1 when any record was not stored."""
    try:
        keep_days = None if args.keep_days is None else check_keep_days(args.keep_days, "--keep-days")
    except SettingError as exc:
        raise ConfigError(str(exc)) from None
    body = Path(args.file).read_bytes()
    try:
        if args.hub:
            stored = HubClient(args.hub).import_steps(body, keep_days=keep_days)
            done = StepsImport(stored, stored)
        else:
            done = _import_into_store(args, body, keep_days)
    except RetentionRefused as refused:  # the hub's answer
        done = StepsImport(refused.records, refused.stored, refused.reason)
    if done.refused:
        print(
            f"imported {done.stored} of {done.records} step records from {args.file}; {done.refused}; "
            "use --keep-days N to keep imported history",
            file=sys.stderr,
        )
        return 1
    kept = f", kept {keep_days} days from now (--keep-days)" if keep_days else ""
    print(f"imported {done.stored} step records from {args.file}{kept}")
    return 0


def _import_into_store(args: argparse.Namespace, body: bytes, keep_days: int | None) -> StepsImport:
    """The records of args.file into the store, whole: none when some are past the steps cutoff and
    `keep_days` does not keep them. The insert tokens come from the file's bytes, so importing it again
    stores nothing twice (and keeps the records as the first import stored them)."""
    rows = list(read_step_records(args.file))  # all checked before any insert
    digest = hashlib.sha256(body).hexdigest()
    store = open_store(hub_config(args))
    try:
        now = time.time()
        if keep_days is None:
            cutoff = store.cutoff("steps", now)
            if old := len(cutoff.split(rows, lambda row: row.ts)[1]):
                return StepsImport(len(rows), 0, import_refusal(len(rows), old, cutoff))
        kept = None if keep_days is None else keep_until(keep_days, now)
        return _insert_in_chunks(store, rows, digest, kept)
    finally:
        store.close()


def _insert_in_chunks(
    store: Store, rows: Sequence[StepRecord], digest: str, kept: float | None
) -> StepsImport:
    """Insert `rows` IMPORT_CHUNK at a time; what the store itself refused (a record that crossed the
    cutoff since it was checked) is reported, not lost."""
    stored = refused = 0
    why = ""
    for start in range(0, len(rows), IMPORT_CHUNK):
        chunk = rows[start : start + IMPORT_CHUNK]
        inserted = store.insert_steps(chunk, token=f"{digest}:{start}", keep_until=kept)
        stored += inserted
        if inserted.refused:
            refused += inserted.refused
            why = inserted.cutoff.describe()
    return StepsImport(len(rows), stored, f"{refused} refused: {why}" if refused else "")


def _anomaly_json(anomaly: Anomaly) -> dict[str, Any]:
    """An anomaly with ISO 8601 UTC times and its evidence as an object."""
    row = asdict(anomaly)
    for key in ("start", "end"):
        if row[key] is not None:
            row[key] = datetime.fromtimestamp(row[key], UTC).isoformat(timespec="milliseconds")
    row["evidence"] = as_dict(anomaly.evidence)
    return row


def cmd_detect(args: argparse.Namespace) -> int:
    """Run the detectors over a time range and print what they find; --save also writes it to the store
    (stable ids: a rerun over the same data stores each anomaly once)."""
    if args.save and args.hub:
        print(
            "fleetlens detect: --save writes anomalies to the store and needs --store (or the config's "
            "store); a hub's API does not take anomalies (its own detection loop writes them)",
            file=sys.stderr,
        )
        return 2
    source = reader(args)
    window = {} if args.window_s is None else {"window_s": args.window_s}
    try:
        anomalies = detect(source, args.start, args.end, names=args.detectors, **window)
        if args.save:
            store_anomalies(source, anomalies)
            print(f"fleetlens detect: saved {len(anomalies)} anomalies to the store", file=sys.stderr)
    finally:
        if not args.hub:
            source.close()
    if args.json:
        print(json.dumps([_anomaly_json(anomaly) for anomaly in anomalies]))
        return 0
    print("\t".join(ANOMALY_COLUMNS))
    for row in map(_anomaly_json, anomalies):
        print("\t".join(str(row[key] or "") for key in ANOMALY_COLUMNS))
    return 0
