"""The hub: the ingest service that scrapes the fleet, receives step times, writes the store, runs detection.

app            the HTTP API (Hub): wires the stages below, routes requests, /metrics, /healthz
apirequests    the API's JSON bodies and query strings, read or refused with a 400 naming the field
auth           who may call what: scoped tokens, loopback only without one
targets        file_sd targets, re-read when they change, and this hub's shard of them
scraper        the scrape loop: a round of every target on aligned ticks, handed to the rounds
scraperound    one round's sockets and parses, on one thread, each scrape with its deadline
targetsession  one target across rounds: keep-alive connection, parser, up/down state
expfmt         the Prometheus text parser
rounds         scraped rounds to the writer on one insert thread, their statuses journaled
httpread       strict HTTP/1.x body readers: scraped responses, API requests
queryslots     fair query slots per client, with a bounded wait
bodies         request bodies: size limits, decompression, UTF-8 and JSON checks
otlp           OTLP/HTTP metric bodies into step records
steplines      step JSON-lines bodies into step records
remote_write   Prometheus remote write requests into scrape batches and statuses
prompb         Prometheus's remote write and read protobuf messages, from their descriptors
groupcommit    remote write requests that arrive together, written together
promql         Prometheus's read API on the store: PromQL queries, series, labels, metadata
remote_read    Prometheus remote read: a Prometheus reads the store as its long-term storage
writer         the one path to the store, an insert per record type, through the spool while it is away
spool          durable on-disk batches, replayed in order
detect         the detection loop, each window's anomalies handed to alerting
topology       the operator's inventory file, re-read on change into the store's topology
errors         the hub's errors, one tree

Every error the hub raises derives from hub.errors.HubError (and from no other package's root); that
module draws the tree with what each class means and where it is raised.
"""
