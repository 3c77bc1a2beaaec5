"""`fleetlens topology import` and `show`: a source's topology into the store, each node's view out of it,
directly (--store, or the config's) or through a hub's API (--hub)."""

from __future__ import annotations

import argparse
import json
import time

from analytics.store.hubclient import HubClient
from analytics.store.topology import Changes, topology_at
from analytics.topology.importers import imported
from analytics.topology.inventory import read_text
from analytics.topology.view import LIST_LAYERS, SINGLE_LAYERS, node_views
from fleetlens.access import hub_config, open_store, reader

SHOW_COLUMNS = ("node", *map(str, SINGLE_LAYERS), *map(str, LIST_LAYERS))


def cmd_topology_import(args: argparse.Namespace) -> int:
    """Store what `args.file` says of the topology, whole, in place of what the same source and reporter
    said before: checked first (TopologyError naming the file, line and key), then one write."""
    text = read_text(args.file)
    if args.hub:
        count, changes = HubClient(args.hub).import_topology(
            args.format, text, file=args.file, reporter=args.reporter
        )
    else:
        said = imported(args.format, text, args.file)
        store = open_store(hub_config(args))
        try:
            changes = store.replace_links(
                said.source, said.links, time.time(), reporter=args.reporter, unsaid=said.unsaid
            )
        finally:
            store.close()
        count = len(said.links)
    print(f"imported {count} links from {args.file} ({args.format}): {_describe(changes)}")
    return 0


def cmd_topology_show(args: argparse.Namespace) -> int:
    """Each node's host, leaf, spine, rails and rack as the topology was at --at (default now)."""
    at = time.time() if args.at is None else args.at
    source = reader(args)
    try:
        views = node_views(topology_at(source, at))
    finally:
        if not args.hub:
            source.close()
    if args.json:
        print(json.dumps(views))
        return 0
    print("\t".join(SHOW_COLUMNS))
    for view in views:
        cells = (view.get(column, "-") for column in SHOW_COLUMNS)
        print("\t".join(",".join(cell) if isinstance(cell, list) else cell for cell in cells))
    return 0


def _describe(changes: Changes) -> str:
    return f"{changes.opened} new, {changes.closed} ended, {changes.unchanged} unchanged"
