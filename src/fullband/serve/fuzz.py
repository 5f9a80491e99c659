"""Property-based fuzzing of the server from its own OpenAPI schema (schemathesis; the ``dev`` extra).

Every operation the app documents gets requests that fit its schema (positive) and, where it takes a body, requests
that do not (negative), sent in process over ASGI. The report counts responses by operation, mode and status; a
5xx, an exception out of the app, or a stream that ends in a server error is a failure. Every response also goes
through every schemathesis check (``st run --checks all``): the report counts their failures by code (ST103 an
undocumented status, ST105 an undocumented content type, ST202 a schema-valid request refused, ...). Used by the
test suite's run (``tests/serve/test_serve_fuzz.py``) and the longer one (``benchmarks/serve_fuzz.py``).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FuzzReport:
    counts: collections.Counter = field(default_factory=collections.Counter)  # (operation, mode, status) -> n
    failures: list[tuple[str, Any, int, str]] = field(default_factory=list)  # (operation, body, status, text)
    health_after: int = 0  # /health's status once the run is over
    check_failures: collections.Counter = field(default_factory=collections.Counter)  # failure code -> n
    check_examples: dict[str, str] = field(default_factory=dict)  # failure code -> its first report

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    def by_status(self) -> dict[int, int]:
        totals: collections.Counter = collections.Counter()
        for (_, _, status), n in self.counts.items():
            totals[status] += n
        return dict(sorted(totals.items()))


def fuzz_app(app: Any, examples: int, seed: int = 0, headers: dict[str, str] | None = None) -> FuzzReport:
    """Send up to ``examples`` generated requests per operation and mode to ``app`` (its lifespan runs), each with
    ``headers`` (``Authorization: Bearer KEY`` for a server with an API key)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_asgi("/openapi.json", app, **({"headers": headers} if headers else {}))
    schema.config.checks.update(included_check_names=["all"])
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()
        has_body = bool(operation.body)
        # A negative case needs something to break: an operation without a body or parameters has none.
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if has_body else (GenerationMode.POSITIVE,)
        for mode in modes:
            run = given(case=operation.as_strategy(mode))(_sender(operation.label, mode.value, report, headers))
            run = settings(max_examples=examples if has_body else 1, deadline=None, database=None,
                           suppress_health_check=list(HealthCheck))(run)
            hypothesis_seed(seed)(run)()
    report.health_after = schema["/health"]["GET"].Case().call(headers=headers).status_code
    return report


def _sender(label: str, mode: str, report: FuzzReport, headers: dict[str, str] | None) -> Callable[[Any], None]:
    def send(case: Any) -> None:  # a plain function: hypothesis' @given takes no partials or defaults
        _send(case, label, mode, report, headers)

    return send


def _send(case: Any, label: str, mode: str, report: FuzzReport, headers: dict[str, str] | None = None) -> None:
    from schemathesis.core.failures import FailureGroup

    try:
        response = case.call(headers=headers)
    except Exception as err:  # an exception out of the app: what a client sees as a 500 or a dropped connection
        report.counts[(label, mode, 500)] += 1
        report.failures.append((label, case.body, 500, f"{type(err).__name__}: {err}"))
        return
    status = response.status_code
    text = response.content.decode("utf-8", "replace")
    # A stream has answered 200 before it runs: a server error shows as its last event instead.
    if status < 500 and '"type": "server_error"' in text:
        status = 500
    report.counts[(label, mode, status)] += 1
    if status >= 500:
        report.failures.append((label, case.body, status, text[:500]))
    try:
        case.validate_response(response)
    except FailureGroup as group:
        for failure in group.exceptions:
            report.check_failures[failure.code] += 1
            report.check_examples.setdefault(failure.code, f"{label} {json.dumps(case.body, default=str)[:300]} -> "
                                                           f"{status} {text[:200]}: {failure.title}")
