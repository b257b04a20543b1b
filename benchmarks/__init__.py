"""Speed and quality benchmarks against what users would use instead."""
