"""The hub: the ingest service that scrapes the fleet, receives step times, writes the store, runs detection.

app        the HTTP API (Hub): receivers, query, silences and requests, /metrics, /healthz
auth       who may call what: scoped tokens, loopback only without one
scraper    file_sd targets scraped on aligned ticks, one deadline per scrape
expfmt     the Prometheus text parser
bodies     request bodies: size limits, decompression, UTF-8 and JSON checks
otlp       OTLP/HTTP metric bodies into step records
steplines  step JSON-lines bodies into step records
errors     the hub's errors, one tree
writer     the one path to the store, through the spool while the store is away
spool      durable on-disk batches, replayed in order
detect     the detection loop, with alerting after each window
"""
