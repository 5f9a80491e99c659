"""The one exception type of the data layer."""

from __future__ import annotations


class DataError(ValueError):
    """A data source, tokenizer or batch request that cannot be served; the message says what to do."""
