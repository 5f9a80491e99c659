"""The package version (its own module, so that code inside fullband reads it without importing the facade)."""

__version__ = "0.1.0"
