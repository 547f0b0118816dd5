"""Hung-engine detection: an engine that holds requests but has stopped producing output."""
