"""The benchmark suite's six workloads (build.py builds them into build/)."""
