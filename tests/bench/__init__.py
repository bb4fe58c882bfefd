"""Tests of the benchmark scripts (bench/): the corpora's builders and runners, the suites' reports
and the micro-benchmarks, on the CPU."""
