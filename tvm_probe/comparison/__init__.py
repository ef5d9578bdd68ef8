"""The compare stage (see docs/architecture.md)."""
from .verdict import (  # noqa: F401
    Status, ValueComparison, Comparison, compare_arrays, compare_many, ResultsReference, compare, judge,
)
