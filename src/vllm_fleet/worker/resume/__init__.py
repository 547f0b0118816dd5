"""Resuming a stream another worker started (migration): held-back tokens and stop strings at the switch."""
