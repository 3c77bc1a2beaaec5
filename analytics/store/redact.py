"""URLs and DSNs fit to print: whatever in them may be a secret is masked.

A store DSN carries a password (`http://user:secret@ch:8123/db`), a webhook's URL often a token in its
query string (`?token=...`); both end up in start-up lines, logs, error messages and stored delivery
outcomes. The user name, host, port and path stay: they say who and where.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"


def redacted(url: str) -> str:
    """`url` with the password of its user info and the values of its query string masked."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL we can take apart: show it as it is only if nothing looks secret
        return url if "@" not in url and "?" not in url else MASK
    netloc = parts.netloc
    if password is not None:
        netloc = netloc.replace(f":{password}@", f":{MASK}@", 1)
    query = parts.query
    if query:
        query = urlencode([(name, MASK) for name, _ in parse_qsl(query, keep_blank_values=True)], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
