"""Test-time decoding: logit extrapolation and selective token replacement, and their selection criteria."""
