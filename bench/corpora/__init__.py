"""Programs built and run under the tool: apps/ (the suite's workloads), hecbench/ and
upstream_tests/ (differential tests). Nothing is imported here: the corpus tarballs carry this file."""
