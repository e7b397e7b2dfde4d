"""Measurement: clocks, the benchmark run, metrics, the roofline, machine fingerprints."""
