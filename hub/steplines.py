"""POST /api/v1/steps and `fleetlens steps import`: step JSON lines (collectors.steprecord) as records.

The JSON-lines contract is ours and versioned with the step SDK, so an unknown key is refused: a misspelt
"compute" would otherwise drop a phase without anyone noticing. A body holds each (job, rank, step, ts)
once, and is taken whole or refused whole, naming the line.
"""

from __future__ import annotations

from http import HTTPStatus

from collectors.steprecord import SeenSteps, StepRecord, parse_step_record
from hub.bodies import (
    DEFAULT_LIMITS,
    JSON,
    ReceiverLimits,
    decompressed,
    label_too_long,
    media_type,
    unsupported_media,
    utf8_text,
)
from hub.errors import PayloadError

STEP_LINES_MEDIA_TYPES = ("application/x-ndjson", "application/jsonl", JSON)


def parse_steps_jsonl(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None = None,
    limits: ReceiverLimits = DEFAULT_LIMITS,
) -> list[StepRecord]:
    """The rows of a `POST /api/v1/steps` body, step JSON lines (collectors.steps), one row per line.

    PayloadError names the line of the first bad one (and, for a step recorded twice, the line of the
    first record). Accepted Content-Types: application/x-ndjson, application/jsonl, and application/json
    (what curl users tend to send). Unknown keys are refused, see the module docstring.
    """
    if media_type(content_type) not in STEP_LINES_MEDIA_TYPES:
        raise unsupported_media(content_type, STEP_LINES_MEDIA_TYPES)
    text = utf8_text(decompressed(body, content_encoding, limits.max_body_bytes))
    rows = []
    seen = SeenSteps()
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(rows) == limits.max_rows:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"line {number}: more than {limits.max_rows} step records in one request; "
                "send them in smaller parts",
            )
        try:
            record = parse_step_record(line)
            seen.check(record, number)
        except ValueError as error:
            raise PayloadError(HTTPStatus.BAD_REQUEST, f"line {number}: {error}") from None
        for name in ("job", "node"):
            if len(label := getattr(record, name)) > limits.max_label_length:
                raise label_too_long(f"line {number}: {name!r}", len(label), limits)
        rows.append(record)
    return rows
