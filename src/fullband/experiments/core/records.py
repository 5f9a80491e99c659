"""The typed records of the studies' results.json: what the code that builds a study's results writes and what its
report reads. Each study keeps its own (its package's records.py); here: the typing they share and the check that a
record has the keys its type names.

TypedDicts rather than dataclasses: results.json is these dicts as written (key order included), so committed
results load back as they are and a re-rendered report stays byte for byte the same; the types name every key the
report reads, and a type checker sees a misspelt one. ``NotRequired`` keys are added later or only sometimes (the
docstring of each says when).
"""

import sys
from typing import Any

# Evaluated annotations (no ``from __future__ import annotations``): TypedDict reads NotRequired off them.
if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # typing_extensions (which torch depends on) has both for Python 3.10
    from typing_extensions import NotRequired, TypedDict

__all__ = ["NotRequired", "TypedDict", "key_problems"]  # the typing every study's records.py imports from here


def key_problems(record: dict[str, Any], record_type: type) -> list[str]:
    """Why ``record`` is not a ``record_type`` by its keys: the required keys it lacks and the keys the type does not
    name (empty when none; the tests check what the studies write against these types)."""
    keys = set(record)
    required, optional = record_type.__required_keys__, record_type.__optional_keys__
    return ([f"{record_type.__name__} lacks {k!r}" for k in sorted(required - keys)]
            + [f"{record_type.__name__} does not name {k!r}" for k in sorted(keys - required - optional)])
